"""Who the bulk peer port lets in, and how it refuses, on real sockets of 127.0.0.1: what
the gRPC peer port refuses (no token, a wrong one, no grant, a caller over its limits) or
declines (a grant outside the dataset's scope) it refuses or declines with the same status,
message and audit record, and the asker reads those blocks from the hub; renewed
certificates are used without a restart, a caller without a client certificate refused;
connections over the cap and requests late or malformed are answered and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest

from deploy.pki import LocalCa
from hub.auth.tokens import Principal
from protocol import bulk
from spoke.mesh import metrics
from spoke.mesh.admission import CallerLimits
from spoke.mesh.bulkclient import PeerBulkClient
from spoke.mesh.grants import GrantKeeper
from spoke.mesh.peerbulk import PeerBulkServer
from spoke.mesh.peerclient import PeerClient, PeerError
from spoke.mesh.transport import PeerTls, PeerToken
from tests.component.mesh_bulk_support import (
    Owner,
    bulk_asker,
    random_blocks,
    read_all,
    region_tls_fixture,  # noqa: F401  (the region_tls fixture)
)
from tests.component.mesh_source_support import (
    EVERYTHING,
    FakeHub,
    _keeper,
)
from tests.support import eventually_async

pytestmark = pytest.mark.timeout(60)


def _same(record: dict[str, Any]) -> dict[str, Any]:
    """An audit record less the caller's port (each call has its own connection)."""
    who = str(record["who"])
    return {**record, "who": who.rpartition(":")[0]}


def _grpc_and_bulk(
    owner_: Owner,
    blocks: dict[str, bytes],
    keeper: GrantKeeper | None,
    token: PeerToken | None,
    tls: PeerTls | None,
) -> list[tuple[str | None, list[str]]]:
    """The same read made over the owner's gRPC peer port and over its bulk peer port:
    ``(error kind and message or None, declined digests)`` of each."""

    async def one(bulk_port: bool) -> tuple[str | None, list[str]]:
        declined: list[str] = []
        sized = [(d, len(b)) for d, b in blocks.items()]
        client = PeerClient(owner_.node, token, tls, keeper)
        bulk_client = PeerBulkClient(owner_.port, token, tls, keeper)
        try:
            if bulk_port:
                stream = bulk_client.read_blocks(
                    owner_.node, sized, "demand", 10, 5, on_declined=declined.extend
                )
            else:
                stream = client.read_blocks(sized, "demand", 10, 5, on_declined=declined.extend)
            async for _ in stream:
                pass
        except PeerError as err:
            return f"{err.kind}: {err}", declined
        finally:
            bulk_client.close()
            await client.close()
        return None, declined

    async def both() -> list[tuple[str | None, list[str]]]:
        return [await one(False), await one(True)]

    return asyncio.run(both())


@pytest.mark.parametrize(
    "case", ["no token", "wrong token", "no grant", "outside scope", "over its limits"]
)
def test_the_bulk_port_refuses_what_grpc_refuses_and_the_asker_reads_the_hub(
    tmp_path: Path, case: str, region_tls: tuple[PeerTls, PeerToken]
) -> None:
    blocks = random_blocks(9)
    tls, token = region_tls
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-region-token-0123456\n")
    presented = {"no token": None, "wrong token": PeerToken(wrong)}.get(case, token)
    principal = Principal("tok-o", ("other",)) if case == "outside scope" else EVERYTHING
    refusals = metrics.PEER_REFUSALS.labels

    async def go() -> tuple[list[tuple[str | None, list[str]]], list[dict[str, Any]], Any]:
        owner_ = Owner(tmp_path / "owner", FakeHub(blocks), blocks)
        limits = CallerLimits(calls=0) if case == "over its limits" else None
        await owner_.start(token, tls, limits)
        keeper = await _keeper("127.0.0.1:1", principal)
        granted = keeper if case != "no grant" else None
        results = await asyncio.to_thread(_grpc_and_bulk, owner_, blocks, granted, presented, tls)
        source, membership, hub, _ = await bulk_asker(
            owner_.node,
            owner_.port,
            blocks,
            principal,
            presented,
            tls,
            granted=case != "no grant",
        )
        wanted = [d for d in blocks if membership.owner(d) == owner_.node]
        got = await read_all(source, blocks, wanted)
        assert got == {d: blocks[d] for d in wanted}
        assert sorted(hub.sent) == sorted(wanted)  # every one of them from the hub
        assert source.bulk is not None
        source.bulk.close()
        await membership.close()
        await owner_.stop()
        return results, owner_.audit.records, None

    before = {r: refusals(r)._value.get() for r in ("token", "no_grant", "declined", "limit")}
    (grpc_result, bulk_result), audited, _ = asyncio.run(go())
    assert grpc_result == bulk_result  # the same status and message, the same declines
    records = [r for r in audited if r["what"] == "peer ReadBlocks"]  # not the probes
    assert len(records) == 3  # gRPC, bulk, and the mesh source's read over bulk
    assert _same(records[0]) == _same(records[1])  # the same audit record
    reasons = {"no grant": "no_grant", "outside scope": "declined", "over its limits": "limit"}
    reason = reasons.get(case, "token")
    assert records[0]["outcome"] == records[2]["outcome"] == f"refused: {reason}"
    assert refusals(reason)._value.get() - before[reason] == len(audited)  # counted too
    if case == "outside scope":
        assert grpc_result[0] is None and sorted(grpc_result[1]) == sorted(blocks)
    else:
        kind = "resource_exhausted" if case == "over its limits" else "refused"
        assert grpc_result[0] is not None and grpc_result[0].startswith(f"{kind}: ")


def test_the_bulk_port_takes_renewed_certificates_for_new_connections(tmp_path: Path) -> None:
    """A renewed certificate pair (same CA) is presented from the next handshake on, as the
    gRPC peer port's dynamic credentials do; a connection without a client certificate is
    refused (mTLS)."""
    ca = LocalCa(tmp_path, "region-ca")
    first, second = ca.issue("first"), ca.issue("second")
    cert, key = tmp_path / "peer.crt", tmp_path / "peer.key"
    cert.write_bytes(first.cert.read_bytes())
    key.write_bytes(first.key.read_bytes())
    clock = [0.0]
    tls = PeerTls(cert, key, ca.cert, now=lambda: clock[0])

    def handshake(port: int, client_cert: bool = True) -> bytes:
        """The certificate the port presents; without a client certificate, b"" once the
        port has ended the connection (TLS 1.3 checks the client after the handshake)."""
        context = ssl.create_default_context(cafile=str(ca.cert))
        if client_cert:
            context.load_cert_chain(str(first.cert), str(first.key))
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
        ):
            if not client_cert:
                with contextlib.suppress(ssl.SSLError, ConnectionError):
                    assert sock.recv(1) == b""
                return b""
            der = sock.getpeercert(binary_form=True)
            assert der is not None
            return der

    async def go() -> tuple[bytes, bytes, bool]:
        server = PeerBulkServer(None, None, tls)  # type: ignore[arg-type]
        port = await server.start("127.0.0.1", 0)
        before = await asyncio.to_thread(handshake, port)
        cert.write_bytes(second.cert.read_bytes())
        key.write_bytes(second.key.read_bytes())
        clock[0] += 2.0  # past transport.RECHECK_S: the files are looked at again
        after = await asyncio.to_thread(handshake, port)
        try:
            refused = await asyncio.to_thread(handshake, port, False) == b""
        except (ssl.SSLError, ConnectionError):
            refused = True  # refused in the handshake itself (TLS 1.2)
        await server.close()
        return before, after, refused

    before, after, refused = asyncio.run(go())
    assert before != after  # the second leaf, without a restart
    assert after == ssl.PEM_cert_to_DER_cert(second.cert.read_text())
    assert refused


def test_what_a_caller_holds_before_it_proves_anything_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection over the cap is answered RESOURCE_EXHAUSTED; a request not whole in
    time is DEADLINE_EXCEEDED (``no_request``) and one that is not the protocol
    INVALID_ARGUMENT (``malformed``), each audited, and the connection closed."""
    from spoke.mesh import peerbulk

    monkeypatch.setattr(peerbulk, "REQUEST_WAIT_S", 0.2)
    blocks = random_blocks(2)

    def answer(port: int, send: bytes) -> tuple[int, str]:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(send)
            head = b""
            while len(head) < bulk.BLOCK_HEAD.size:
                more = sock.recv(bulk.BLOCK_HEAD.size - len(head))
                assert more, "closed without an answer"
                head += more
            code, _, length = bulk.parse_peer_reply_head(head)
            message = b""
            while len(message) < length:
                message += sock.recv(length - len(message))
            assert sock.recv(1) == b""  # then closed
            return code, message.decode()

    async def go() -> tuple[list[tuple[int, str]], list[str]]:
        owner_ = Owner(tmp_path / "owner", FakeHub(blocks), blocks)
        await owner_.start()
        capped = PeerBulkServer(owner_.service.gate, owner_.service.blocks, None, 1)
        capped_port = await capped.start("127.0.0.1", 0)
        silent = socket.create_connection(("127.0.0.1", capped_port))
        await eventually_async(lambda: capped.slots.open == 1, "the first connection open there")
        # a newcomer displaces a connection that has shown nothing (doorslots.py)...
        held = socket.create_connection(("127.0.0.1", capped_port))
        silent.settimeout(10)
        assert await asyncio.to_thread(silent.recv, 1) == b""
        silent.close()
        assert capped.slots.displaced == 1
        # ...but not one that showed the token: then the newcomer is refused
        await eventually_async(lambda: capped.slots.unproven("127.0.0.1"), "the newcomer's slot")
        capped.slots.prove(capped.slots.unproven("127.0.0.1")[0], "region")
        answers = [
            await asyncio.to_thread(answer, capped_port, b""),
            await asyncio.to_thread(answer, owner_.port, bulk.PEER_HEAD.pack(bulk.PEER_MAGIC, 10)),
            await asyncio.to_thread(answer, owner_.port, b"GET / HTTP/1.1\r\n\r\n"),
        ]
        held.close()
        await capped.close()
        await owner_.stop()
        return answers, [r["outcome"] for r in owner_.audit.records]

    answers, outcomes = asyncio.run(go())
    assert [code for code, _ in answers] == [8, 4, 3]
    assert "bulk peer connections are open" in answers[0][1]
    assert "no whole request within 0.2 s" in answers[1][1]
    assert "not a peer bulk request" in answers[2][1]
    assert outcomes == ["refused: no_request", "refused: malformed"]


def test_tls_handshakes_pending_at_the_bulk_port_are_never_more_than_its_slots(
    tmp_path: Path, region_tls: tuple[PeerTls, PeerToken]
) -> None:
    """Connections that never begin their TLS handshake each hold a slot, and a newcomer
    displaces the oldest: asyncio's own handshakes (before a connection reached the port's
    code) were not counted at all, each kept up to its handshake timeout."""
    tls, _ = region_tls

    async def go() -> tuple[int, int, bytes]:
        server = PeerBulkServer(None, None, tls, 4)  # type: ignore[arg-type]
        port = await server.start("127.0.0.1", 0)
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        await eventually_async(lambda: server.slots.displaced == 16, "16 displaced")
        socks[0].settimeout(10)
        first = await asyncio.to_thread(_end_of, socks[0])  # the oldest: closed
        held = server.slots.open
        for sock in socks:
            sock.close()
        await server.close()
        return held, server.slots.displaced, first

    held, displaced, first = asyncio.run(go())
    assert (held, displaced, first) == (4, 16, b"")


def _end_of(sock: socket.socket) -> bytes:
    """What a closed connection reads: nothing (a reset reads as nothing too)."""
    try:
        return sock.recv(1)
    except ConnectionResetError:
        return b""
