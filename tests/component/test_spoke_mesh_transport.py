"""The peer port's certificates reload without a restart: the server presents renewed
files at the next connection, clients build a new channel for new calls, and a renewal
caught half way (a key not matching its certificate) is not used until it is complete."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
from pathlib import Path

import grpc
import grpc.aio
import pytest

from deploy.local import free_port
from deploy.pki import LocalCa
from protocol.spoke.v1 import peer_pb2, peer_pb2_grpc
from spoke.mesh.peerclient import PeerClient
from spoke.mesh.transport import PeerTls

pytestmark = pytest.mark.timeout(60)


class Plain(peer_pb2_grpc.SpokePeerServicer):
    async def Probe(self, request: object, context: object) -> peer_pb2.ProbeResponse:
        return peer_pb2.ProbeResponse(node="owner")


def _served(port: int, ca: Path) -> bytes:
    """The certificate the port presents now (DER), by a fresh TLS handshake."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def _der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def test_renewed_certificates_are_served_and_used_without_a_restart(tmp_path: Path) -> None:
    ca = LocalCa(tmp_path, "region-ca")
    first, second = ca.issue("first"), ca.issue("second")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(first.cert, cert)
    shutil.copy(first.key, key)
    now = [0.0]
    server_tls = PeerTls(cert, key)  # no client CA: a plain TLS handshake can look
    client_tls = PeerTls(cert, key, ca.cert, now=lambda: now[0])

    async def go() -> list[object]:
        seen: list[object] = []
        server = grpc.aio.server()
        peer_pb2_grpc.add_SpokePeerServicer_to_server(Plain(), server)  # type: ignore[no-untyped-call]
        port = free_port()
        server.add_secure_port(f"127.0.0.1:{port}", server_tls.server_credentials())
        await server.start()
        client = PeerClient(f"localhost:{port}", tls=client_tls)
        seen.append((await client.probe(5)).node)
        seen.append(await asyncio.to_thread(_served, port, ca.cert) == _der(first.cert))
        # half a renewal: the new certificate, the old key
        shutil.copy(second.cert, cert)
        seen.append(await asyncio.to_thread(_served, port, ca.cert) == _der(first.cert))
        now[0] += 2
        seen.append((await client.probe(5)).node)
        seen.append(client_tls.generation)
        shutil.copy(second.key, key)  # complete
        seen.append(await asyncio.to_thread(_served, port, ca.cert) == _der(second.cert))
        now[0] += 2
        seen.append((await client.probe(5)).node)
        seen.append(client_tls.generation)
        await client.close()
        await server.stop(0)
        return seen

    assert asyncio.run(go()) == ["owner", True, True, "owner", 0, True, "owner", 1]
