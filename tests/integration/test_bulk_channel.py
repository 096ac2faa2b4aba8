"""The bulk block channel (hub/serve/bulk.py, spoke/hublink/bulk.py) on 127.0.0.1: the bytes of
gRPC's ReadBlocks without gRPC, and every refusal gRPC makes, with the same status and
audit line."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hub.publish.tree import publish
from hub.serve.bulk import MAX_CONNECTIONS as BULK_CONNECTIONS
from hub.serve.config import ServerConfig
from hub.serve.metrics import HubMetrics
from hub.serve.serverthread import ServerThread
from protocol import bulk
from protocol.hub.v1 import hub_pb2_grpc
from spoke.errors import CorruptBlock, HubUnavailable, NotFound
from spoke.fetch.priority import Priority
from spoke.hublink.bulk import BulkSource
from spoke.hublink.client import HubClient
from spoke.hublink.credentials import HubCredentials
from tests.integration.hub_support import (
    Pki,
    bearer,
    manifest,
    pki_fixture,  # noqa: F401  (the pki fixture)
    read_all,
    sample,
    write_tree,
)

ALPHA_TOKEN = "alpha-bulk-reader-0123456789abcdef"
ADMIN_TOKEN = "platform-bulk-fedcba9876543210"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("bulk")
    data = base / "data"
    alpha = write_tree(
        base / "alpha",
        {f"f{i}.bin": os.urandom(size) for i, size in enumerate((1, 4096, 70_000, 300_001))},
    )
    beta = write_tree(base / "beta", {"secret.bin": os.urandom(5000)})
    publish(data, "alpha", alpha, block_size=65536)
    publish(data, "beta", beta)
    return data


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokens") / "tokens.yaml"
    path.write_text(f'"{ALPHA_TOKEN}": ["alpha"]\n"{ADMIN_TOKEN}": "*"\n')
    return path


@pytest.fixture(scope="module")
def hub(data: Path, tokens_file: Path) -> Iterator[tuple[ServerThread, HubMetrics]]:
    metrics = HubMetrics()
    config = ServerConfig(tokens=tokens_file, insecure=True, bulk_port=0)
    with ServerThread(data, metrics=metrics, config=config) as server:
        yield server, metrics


@pytest.fixture(scope="module")
def stub(hub: tuple[ServerThread, HubMetrics]) -> Iterator[hub_pb2_grpc.HubStub]:
    with grpc.insecure_channel(f"127.0.0.1:{hub[0].port}") as channel:
        yield hub_pb2_grpc.HubStub(channel)


def bulk_port(server: ServerThread) -> int:
    assert server.server.bulk is not None
    return server.server.bulk.port


def blocks_of(stub: hub_pb2_grpc.HubStub, dataset: str, token: str) -> list[tuple[str, int]]:
    entries = manifest(stub, dataset, metadata=bearer(token))
    return [(b.digest, b.size) for e in entries.values() for b in e.blocks]


def token_file(tmp_path: Path, token: str) -> Path:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


async def fetch_all(
    source: BulkSource, blocks: list[tuple[str, int]], timeout: float = 10.0
) -> dict[str, bytes]:
    return {d: bytes(b) async for d, b in source.read_blocks(blocks, timeout, Priority.DEMAND)}


def source_for(port: int, bulk: int, token: Path | None, workers: int = 1) -> BulkSource:
    credentials = HubCredentials(token_file=token)
    return BulkSource(HubClient(f"127.0.0.1:{port}", credentials=credentials), bulk, workers)


def fetched(
    port: int,
    bulk: int,
    token: Path | None,
    calls: list[list[tuple[str, int]]],
    workers: int = 1,
    timeout: float = 10.0,
) -> list[dict[str, bytes]]:
    """Each call's blocks through one BulkSource (made and closed in its own loop), the
    calls at once."""

    async def main() -> list[dict[str, bytes]]:
        source = source_for(port, bulk, token, workers)
        try:
            results = []
            for call in calls[:1]:  # the first alone: later ones re-use its connection
                results.append(await fetch_all(source, call, timeout))
            results += await asyncio.gather(*(fetch_all(source, c, timeout) for c in calls[1:]))
            return results
        finally:
            source.close()
            await source.hub.close()

    return asyncio.run(main())


def raw_request(port: int, token: str, digests: list[str]) -> tuple[int, str]:
    """Sends one request by hand; the first frame's code and (error) message."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(bulk.encode_request(token, digests))
        head = recv_exactly(sock, bulk.BLOCK_HEAD.size)
        code, _, length = bulk.parse_block_head(head)
        message = recv_exactly(sock, length).decode() if code != bulk.OK else ""
        return code, message


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        part = sock.recv(size - len(data))
        if not part:
            raise EOFError(f"closed after {len(data)} of {size} bytes")
        data += part
    return data


def test_bulk_bytes_are_grpcs_bytes(
    hub: tuple[ServerThread, HubMetrics], stub: hub_pb2_grpc.HubStub, tmp_path: Path
) -> None:
    server, metrics = hub
    blocks = blocks_of(stub, "alpha", ALPHA_TOKEN)
    assert len(blocks) >= 8, "several blocks, a one-byte file among them"
    expected = read_all(stub, [d for d, _ in blocks], bearer(ALPHA_TOKEN))
    served = sample(metrics, "ReadBlocks", "OK")
    token = token_file(tmp_path, ALPHA_TOKEN)
    got = fetched(server.port, bulk_port(server), token, [blocks, blocks[::-1]])
    assert got == [expected, expected]
    assert sample(metrics, "ReadBlocks", "OK") == served + 2


def test_n_workers_receive_the_same_bytes_as_one(
    hub: tuple[ServerThread, HubMetrics], stub: hub_pb2_grpc.HubStub, tmp_path: Path
) -> None:
    server, _ = hub
    blocks = blocks_of(stub, "alpha", ALPHA_TOKEN)
    token = token_file(tmp_path, ALPHA_TOKEN)
    calls = [blocks[i:] + blocks[:i] for i in range(len(blocks))]
    one = fetched(server.port, bulk_port(server), token, calls, workers=1)
    four = fetched(server.port, bulk_port(server), token, calls, workers=4)
    assert one == four
    assert all(result == one[0] for result in one + four)


@pytest.mark.parametrize(
    ("token", "code", "message"),
    [
        ("", "UNAUTHENTICATED", "missing bearer token"),
        ("not-a-token-anyone-knows", "UNAUTHENTICATED", "unknown bearer token"),
        (ALPHA_TOKEN, "NOT_FOUND", "unknown block"),
    ],
    ids=["no-token", "unknown-token", "outside-scope"],
)
def test_bulk_refuses_what_grpc_refuses(
    hub: tuple[ServerThread, HubMetrics],
    stub: hub_pb2_grpc.HubStub,
    data: Path,
    token: str,
    code: str,
    message: str,
) -> None:
    server, metrics = hub
    secret = blocks_of(stub, "beta", ADMIN_TOKEN)[0][0]
    with pytest.raises(grpc.RpcError) as caught:
        read_all(stub, [secret], bearer(token) if token else ())
    assert caught.value.code().name == code
    assert message in (caught.value.details() or "")
    audit = data / "audit.jsonl"
    lines = audit.read_text().splitlines() if audit.exists() else []
    before = sample(metrics, "ReadBlocks", code)
    got, details = raw_request(bulk_port(server), token, [secret])
    assert bulk.STATUS_NAMES[got] == code
    assert details == caught.value.details(), "the same message as gRPC's"
    assert sample(metrics, "ReadBlocks", code) == before + 1
    after = audit.read_text().splitlines() if audit.exists() else []  # none audited yet
    new = [json.loads(line) for line in after[len(lines) :]]
    if code == "UNAUTHENTICATED":  # refused for its token: audited, as gRPC's refusal was
        assert [(r["what"], r["outcome"], r["detail"]) for r in new] == [
            ("ReadBlocks", code, details)
        ]
        assert new[0]["who"].startswith("ipv4:127.0.0.1:")
    else:
        assert new == []


def test_bulk_refusals_become_spoke_errors(
    hub: tuple[ServerThread, HubMetrics], stub: hub_pb2_grpc.HubStub, tmp_path: Path
) -> None:
    server, _ = hub
    secret = blocks_of(stub, "beta", ADMIN_TOKEN)[0]
    token = token_file(tmp_path, ALPHA_TOKEN)
    with pytest.raises(NotFound, match="unknown block"):
        fetched(server.port, bulk_port(server), token, [[secret]])
    with pytest.raises(HubUnavailable, match="missing bearer token"):
        fetched(server.port, bulk_port(server), None, [[secret]])


def test_bad_requests_are_invalid_argument(hub: tuple[ServerThread, HubMetrics]) -> None:
    server, _ = hub
    with socket.create_connection(("127.0.0.1", bulk_port(server)), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        code, _, length = bulk.parse_block_head(recv_exactly(sock, bulk.BLOCK_HEAD.size))
        assert bulk.STATUS_NAMES[code] == "INVALID_ARGUMENT"
        assert "not a bulk request" in recv_exactly(sock, length).decode()
        assert sock.recv(1) == b"", "the hub closed the connection"
    with socket.create_connection(("127.0.0.1", bulk_port(server)), timeout=10) as sock:
        sock.sendall(bulk.REQUEST_HEAD.pack(bulk.MAGIC, 0) + bulk.COUNT.pack(0))
        code, _, length = bulk.parse_block_head(recv_exactly(sock, bulk.BLOCK_HEAD.size))
        assert bulk.STATUS_NAMES[code] == "INVALID_ARGUMENT"


def _mtls(
    tokens_file: Path, pki: Pki, bulk_max_connections: int = BULK_CONNECTIONS
) -> ServerConfig:
    """A hub with mutual TLS, tokens and a bulk port."""
    return ServerConfig(
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        client_ca=pki.ca.pem.cert,
        tokens=tokens_file,
        bulk_port=0,
        bulk_max_connections=bulk_max_connections,
    )


def _alpha_over_mtls(
    server: ServerThread, pki: Pki, tmp_path: Path
) -> tuple[HubCredentials, list[tuple[str, int]]]:
    """A spoke's credentials (client certificate, alpha's token) and alpha's blocks."""
    credentials = HubCredentials(
        ca=pki.ca.pem.cert,
        cert=pki.client.cert,
        key=pki.client.key,
        token_file=token_file(tmp_path, ALPHA_TOKEN),
    )
    channel = grpc.secure_channel(
        f"localhost:{server.port}",
        grpc.ssl_channel_credentials(
            pki.ca.pem.cert_bytes, pki.client.key_bytes, pki.client.cert_bytes
        ),
    )
    with channel:
        return credentials, blocks_of(hub_pb2_grpc.HubStub(channel), "alpha", ALPHA_TOKEN)


def test_mutual_tls_and_tokens(data: Path, tokens_file: Path, pki: Pki, tmp_path: Path) -> None:
    with ServerThread(data, config=_mtls(tokens_file, pki)) as server:
        credentials, blocks = _alpha_over_mtls(server, pki, tmp_path)

        async def through(credentials: HubCredentials) -> dict[str, bytes]:
            client = HubClient(f"localhost:{server.port}", credentials=credentials)
            source = BulkSource(client, bulk_port(server), 2)
            try:
                return await fetch_all(source, blocks)
            finally:
                source.close()
                await client.close()

        got = asyncio.run(through(credentials))
        assert sorted(got) == sorted(d for d, _ in blocks)
        # a client without a certificate of the hub's CA gets no byte
        plain = HubCredentials(ca=pki.ca.pem.cert, token_file=credentials.token_file)
        with pytest.raises(HubUnavailable):
            asyncio.run(through(plain))


def test_silent_connections_beyond_the_cap_are_closed_at_once_and_a_reader_still_reads(
    data: Path, tokens_file: Path, pki: Pki, tmp_path: Path
) -> None:
    """The fifteenth probe: asyncio did a bulk connection's TLS handshake before the cap
    was asked, so silent connections (no certificate, no byte) were held up to the
    handshake timeout, counted nowhere: a replica past its 1 GiB limit. Now each holds a
    slot from the start; a newcomer displaces the oldest of them at once, and a spoke
    whose connection carried its token keeps it."""
    with ServerThread(data, config=_mtls(tokens_file, pki, bulk_max_connections=4)) as server:
        credentials, blocks = _alpha_over_mtls(server, pki, tmp_path)

        async def flooded() -> tuple[dict[str, bytes], list[bytes], dict[str, bytes]]:
            client = HubClient(f"localhost:{server.port}", credentials=credentials)
            source = BulkSource(client, bulk_port(server), 1)
            silent: list[socket.socket] = []
            try:
                first = await fetch_all(source, blocks)  # its connection carried the token
                for _ in range(20):
                    silent.append(socket.create_connection(("127.0.0.1", bulk_port(server))))
                ends = await asyncio.to_thread(lambda: [_end_of(s) for s in silent[:16]])
                again = await fetch_all(source, blocks)  # on the connection it kept
                return first, ends, again
            finally:
                for sock in silent:
                    sock.close()
                source.close()
                await client.close()

        first, ends, again = asyncio.run(flooded())
        assert sorted(first) == sorted(again) == sorted(d for d, _ in blocks)
        assert ends == [b""] * 16  # the 16 oldest silent ones, closed without a handshake


def _end_of(sock: socket.socket) -> bytes:
    """What a connection the server closed reads (a reset reads as nothing too)."""
    sock.settimeout(5)  # well under the 10 s handshake timeout
    try:
        return sock.recv(1)
    except ConnectionResetError:
        return b""


class FakeHub:
    """A bulk port that answers the first request with ``reply`` and closes."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(self.reply)

    def close(self) -> None:
        self.sock.close()


def test_a_corrupt_block_and_a_cut_stream(tmp_path: Path) -> None:
    good = os.urandom(1000)
    from spoke.disk.layout import block_digest

    digest = block_digest(good)
    for reply, error, match in [
        (bulk.encode_block_head(digest, 1000) + bytes(1000), CorruptBlock, "verification"),
        (bulk.encode_block_head(digest, 1000) + good[:500], HubUnavailable, "closed after"),
        (bulk.encode_block_head(digest, 2000) + bytes(2000), HubUnavailable, "out of order"),
    ]:
        fake = FakeHub(reply)
        try:
            with pytest.raises(error, match=match):
                fetched(1, fake.port, None, [[(digest, 1000)]], timeout=5)
        finally:
            fake.close()


def test_a_bulk_port_in_use_is_a_listen_error(data: Path) -> None:
    from hub.errors import ListenError

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ListenError, match=f"127.0.0.1:{port} \\(--bulk-port\\)"):
            ServerThread(data, config=ServerConfig(bulk_port=port)).start()
