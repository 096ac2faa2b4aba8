"""The hub's gRPC port through its door (strata_local/door.py) on 127.0.0.1, under mTLS and
tokens: a flood of connections that never begin their handshake, from many addresses and
far more than the cap, keeps no new spoke out and never displaces a connection whose call
carried a token; refusals are audited with the caller's own address.

The fifteenth probe: gRPC core closed each connection beyond ``--max-connections`` as it
arrived, so about 300 silent connections a second kept most new spokes out of the hub."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import ssl
import struct
import threading
import time
from pathlib import Path

import grpc
import h2.config
import h2.connection
import pytest

from hub.publish.tree import publish
from hub.serve.config import ServerConfig
from hub.serve.serverthread import ServerThread
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc
from tests.integration.hub_support import (
    Pki,
    bearer,
    pki_fixture,  # noqa: F401  (the pki fixture)
    write_tree,
)
from tests.support import client_hello, silent_flood

pytestmark = pytest.mark.timeout(120)

TOKEN = "door-reader-0123456789abcdef0123"
CAP = 64  # --max-connections of the hub under test
FLOOD_PER_S = 400  # a new spoke keeps its slot about CAP / FLOOD_PER_S = 0.16 s


def _channel(pki: Pki, port: int) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(
        pki.ca.pem.cert_bytes, pki.client.key_bytes, pki.client.cert_bytes
    )
    return grpc.secure_channel(f"localhost:{port}", credentials)


def _hub(tmp_path: Path, pki: Pki, tokens: str) -> tuple[Path, ServerConfig]:
    """A data directory with one dataset and a hub's config: mTLS, ``tokens`` (the token
    file's text), the door's cap at CAP, an audit log."""
    data = tmp_path / "data"
    publish(data, "ds", write_tree(tmp_path / "src", {"a.bin": os.urandom(1000)}))
    (tmp_path / "tokens.yaml").write_text(tokens)
    config = ServerConfig(
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        client_ca=pki.ca.pem.cert,
        tokens=tmp_path / "tokens.yaml",
        max_connections=CAP,
        audit_log=tmp_path / "audit.jsonl",
    )
    return data, config


def test_a_flood_of_silent_connections_keeps_no_new_spoke_out(tmp_path: Path, pki: Pki) -> None:
    data, config = _hub(tmp_path, pki, f'"{TOKEN}": "*"\n')
    with ServerThread(data, config=config) as server:
        door = server.server.door
        assert door is not None
        first = _channel(pki, server.port)
        stub = hub_pb2_grpc.HubStub(first)
        stub.ListDatasets(hub_pb2.ListDatasetsRequest(), metadata=bearer(TOKEN), timeout=5)
        assert door.slots.proven == 1  # the call carried a token: its connection kept
        stop, opened = threading.Event(), []
        flood = threading.Thread(
            target=silent_flood, args=(server.port, stop, opened, FLOOD_PER_S, "127.0.1")
        )
        flood.start()
        answers = []
        try:
            deadline = time.monotonic() + 30
            while door.slots.displaced + door.slots.refused < 2 * CAP:
                assert time.monotonic() < deadline, "the flood never passed the cap"
                time.sleep(0.05)
            for _ in range(10):
                with _channel(pki, server.port) as newcomer:
                    try:
                        hub_pb2_grpc.HubStub(newcomer).ListDatasets(
                            hub_pb2.ListDatasetsRequest(), metadata=bearer(TOKEN), timeout=5
                        )
                        answers.append("OK")
                    except grpc.RpcError as err:
                        answers.append(f"{err.code().name}: {err.details()}")
                stub.ListDatasets(hub_pb2.ListDatasetsRequest(), metadata=bearer(TOKEN), timeout=5)
            kept = door.slots.proven
            # a refused call is audited with the address it came from, not the door's socket
            with _channel(pki, server.port) as wrong, pytest.raises(grpc.RpcError):
                hub_pb2_grpc.HubStub(wrong).ListDatasets(
                    hub_pb2.ListDatasetsRequest(), metadata=bearer("not-a-token"), timeout=5
                )
        finally:
            stop.set()
            flood.join()
            for sock in opened:
                sock.close()
        first.close()
    assert answers == ["OK"] * 10
    assert kept >= 1  # the first spoke's connection was never displaced
    assert len(opened) > 3 * CAP
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    refused = [r for r in records if r.get("outcome") == "UNAUTHENTICATED"]
    assert refused and all(str(r["who"]).startswith("ipv4:127.0.0.1:") for r in refused)


def test_a_proven_connection_is_counted_for_the_token_that_proved_it(
    tmp_path: Path, pki: Pki
) -> None:
    """Proven slots are shared by token as well as by address (strata_local/doorslots.py):
    the seventeenth probe's holder of one token, one proven connection from each of 2,048
    addresses, kept every new spoke out while they were shared by address alone."""
    other = "door-second-0123456789abcdef0123"
    data, config = _hub(tmp_path, pki, f'"{TOKEN}": "*"\n"{other}": [ds]\n')
    with ServerThread(data, config=config) as server:
        door = server.server.door
        assert door is not None
        channels = [_channel(pki, server.port) for _ in range(3)]
        for channel, token in zip(channels, (TOKEN, other, TOKEN), strict=True):
            hub_pb2_grpc.HubStub(channel).ListDatasets(
                hub_pb2.ListDatasetsRequest(), metadata=bearer(token), timeout=5
            )
        holders = sorted(s.holder for s in door._by_name.values() if s.proven)
        # a call without an accepted token (one revoked since, say) takes the proof back
        with pytest.raises(grpc.RpcError) as refused:
            hub_pb2_grpc.HubStub(channels[0]).ListDatasets(
                hub_pb2.ListDatasetsRequest(), metadata=bearer("revoked-token"), timeout=5
            )
        still = door.slots.proven
        for channel in channels:
            channel.close()
    assert len(holders) == 3  # each channel's connection, proven
    assert len(set(holders)) == 2  # counted for the subject of the token that proved it
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert still == 2


def test_a_restarted_hub_knows_who_proved_a_token_before(tmp_path: Path, pki: Pki) -> None:
    """Who proved a token from which address is kept in the data directory across a
    restart (strata_local/knownhosts.py), for the gRPC port and the bulk port: a restarted
    hub knew nobody, so its returning fleet waited behind a flood from new addresses (the
    twenty-first probe, F2: 69 of 500 spokes back after 1 s)."""
    data, config = _hub(tmp_path, pki, f'"{TOKEN}": "*"\n')
    config = dataclasses.replace(config, bulk_port=0)
    with ServerThread(data, config=config) as server:
        door = server.server.door
        assert door is not None and server.server.bulk is not None
        with _channel(pki, server.port) as channel:
            hub_pb2_grpc.HubStub(channel).ListDatasets(
                hub_pb2.ListDatasetsRequest(), metadata=bearer(TOKEN), timeout=5
            )
        holder = door.slots.known.subject("127.0.0.1")
    saved = json.loads((data / "known-callers.json").read_text())
    with ServerThread(data, config=config) as server:
        door, bulk = server.server.door, server.server.bulk
        assert door is not None and bulk is not None
        known_again = door.slots.known.subject("127.0.0.1")
        shared = bulk.slots.known is door.slots.known
        metric = server.server.metrics.registry.get_sample_value("strata_hub_known_callers")
    (data / "known-callers.json").write_text("not json")  # a damaged file: nobody known
    with ServerThread(data, config=config) as server:
        door = server.server.door
        assert door is not None
        known_after_damage = len(door.slots.known)
    assert holder is not None
    assert [entry[:2] for entry in saved["hosts"]] == [["127.0.0.1", holder]]
    assert known_again == holder and shared and metric == 1
    assert known_after_damage == 0


def _tls(pki: Pki) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca.pem.cert))
    context.load_cert_chain(str(pki.client.cert), str(pki.client.key))
    context.set_alpn_protocols(["h2"])
    return context


def _list_datasets(tls: ssl.SSLSocket, token: str) -> str:
    """One ListDatasets call over raw HTTP/2 on ``tls``; its ``grpc-status`` (``EOF``
    if the hub ended the connection first)."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(
        1,
        [
            (":method", "POST"), (":scheme", "https"), (":authority", "localhost"),
            (":path", "/protocol.hub.v1.Hub/ListDatasets"),
            ("content-type", "application/grpc"), ("te", "trailers"),
            ("authorization", f"Bearer {token}"),
        ],
    )  # fmt: skip
    conn.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)
    try:
        tls.sendall(conn.data_to_send())
        while data := tls.recv(65536):
            for event in conn.receive_data(data):
                for name, value in getattr(event, "headers", None) or []:
                    if name in (b"grpc-status", "grpc-status"):
                        return value.decode() if isinstance(value, bytes) else str(value)
            if out := conn.data_to_send():
                tls.sendall(out)
    except (ConnectionError, ssl.SSLError):
        pass
    return "EOF"


def test_a_spoke_that_finished_its_handshake_outlasts_a_flood_of_client_hellos(
    tmp_path: Path, pki: Pki
) -> None:
    """A connection whose client finished its TLS handshake gives way only after the
    flood's, which sent a whole ClientHello and nothing more (strata_local/doorslots.py):
    a restarted hub's fleet was displaced after its handshakes, before its first calls
    proved it (45 of 500 spokes back after 30 s under 4,000 ClientHellos a second)."""
    data, config = _hub(tmp_path, pki, f'"{TOKEN}": "*"\n')
    with ServerThread(data, config=config) as server:
        door = server.server.door
        assert door is not None
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        spoke = _tls(pki).wrap_socket(raw, server_hostname="localhost")
        deadline = time.monotonic() + 10
        while door.slots.answered < 1:  # its Finished has passed the door
            assert time.monotonic() < deadline, "the handshake never counted as answered"
            time.sleep(0.01)
        stop, opened = threading.Event(), []
        hello = client_hello(_tls(pki))
        flood = threading.Thread(
            target=silent_flood, args=(server.port, stop, opened, FLOOD_PER_S, "127.0.2", hello)
        )
        flood.start()
        try:
            while door.slots.displaced < 3 * CAP:
                assert time.monotonic() < deadline + 20, "the flood never passed the cap"
                time.sleep(0.05)
            status = _list_datasets(spoke, TOKEN)  # its first call, after the flood's turnover
        finally:
            stop.set()
            flood.join()
            for sock in opened:
                sock.close()
            spoke.close()
    assert status == "0"
    assert len(opened) > 3 * CAP


def test_only_a_handshake_the_server_accepts_counts_as_answered(tmp_path: Path, pki: Pki) -> None:
    """Five bytes after the server's first flight, a record header whose body never
    comes, cost a flood no key exchange: the connection is not answered (the
    twenty-second probe kept 15,218 of 60,000 so); a client whose Finished gRPC accepted
    is, once gRPC speaks to it again."""
    data, config = _hub(tmp_path, pki, f'"{TOKEN}": "*"\n')
    with ServerThread(data, config=config) as server:
        door = server.server.door
        assert door is not None
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as cheap:
            cheap.sendall(client_hello(_tls(pki)))
            flight = cheap.recv(65536)  # ServerHello and the rest of the server's flight
            cheap.sendall(b"\x14\x03\x03\x00\x01")  # a ChangeCipherSpec header, no body
            time.sleep(0.5)
            cheap_answered = door.slots.answered
            raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            with _tls(pki).wrap_socket(raw, server_hostname="localhost"):
                deadline = time.monotonic() + 10
                while door.slots.answered < 1 and time.monotonic() < deadline:
                    time.sleep(0.01)
                real_answered = door.slots.answered
    assert flight and cheap_answered == 0
    assert real_answered == 1


def _without_key_shares(hello: bytes) -> bytes:
    """``hello`` (a ClientHello's record) offering no key share, so that a TLS 1.3 server
    answers with a HelloRetryRequest (RFC 8446, 4.1.4); its padding dropped."""
    body = hello[9:]  # after the record's header (5) and the handshake's (4)
    at = 2 + 32  # legacy_version, random
    at += 1 + body[at]  # session id
    at += 2 + struct.unpack(">H", body[at : at + 2])[0]  # cipher suites
    at += 1 + body[at]  # compression methods
    extensions, out, read = body[at + 2 :], b"", 0
    while read < len(extensions):
        kind, size = struct.unpack(">HH", extensions[read : read + 4])
        data = extensions[read + 4 : read + 4 + size]
        read += 4 + size
        if kind == 0x0015:  # padding
            continue
        if kind == 0x0033:  # key_share: an empty list
            data = b"\x00\x00"
        out += struct.pack(">HH", kind, len(data)) + data
    message = body[:at] + struct.pack(">H", len(out)) + out
    handshake = b"\x01" + len(message).to_bytes(3, "big") + message
    return b"\x16\x03\x01" + struct.pack(">H", len(handshake)) + handshake


def test_a_hello_retry_answered_by_a_canned_hello_is_not_answered(tmp_path: Path, pki: Pki) -> None:
    """A ClientHello with no key share draws a HelloRetryRequest; a second, canned
    ClientHello then draws the server's real flight. Neither costs the caller a key
    exchange, so the HelloRetryRequest must not count as the server's first flight (the
    twenty-third probe's N1: 893 of 900 such connections counted answered)."""
    data, config = _hub(tmp_path, pki, f'"{TOKEN}": "*"\n')
    hello = client_hello(_tls(pki))
    with ServerThread(data, config=config) as server:
        door = server.server.door
        assert door is not None
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as cheap:
            cheap.sendall(_without_key_shares(hello))
            retry = cheap.recv(65536)  # the HelloRetryRequest
            cheap.sendall(hello)  # a key share it never computes with
            flight = b""
            while len(flight) < 256:
                more = cheap.recv(65536)
                assert more, "the server closed instead of sending its flight"
                flight += more
            time.sleep(0.5)
            answered = door.slots.answered
    assert retry[:1] == b"\x16" and len(retry) < 256
    assert answered == 0
