"""The bulk peer port (``--peer-bulk-port``) in one process, on real sockets of 127.0.0.1:
what an asker reads through it. An owner serves its peers' reads by ``sendfile``
(plaintext) or under mTLS with the region token, fetching each block from the hub once for
every asker; a corrupt, oversized or cut block from a peer is caught and read from the hub,
and the peer leaves the mesh; a kept connection the owner closed is dialled again; the port
is off unless configured. Who the port lets in and how it refuses:
test_spoke_mesh_bulk_admission.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol import bulk
from spoke.mesh import metrics
from spoke.mesh.peerbulk import PeerBulkServer
from spoke.mesh.transport import PeerTls, PeerToken
from tests.component.mesh_bulk_support import (
    Owner,
    bulk_asker,
    random_blocks,
    read_all,
    region_tls_fixture,  # noqa: F401  (the region_tls fixture)
)
from tests.component.mesh_source_support import FakeHub

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("secured", [False, True], ids=["sendfile", "mtls-token"])
def test_bytes_through_a_peer_over_bulk_are_the_hubs_and_fetched_once(
    tmp_path: Path, secured: bool, region_tls: tuple[PeerTls, PeerToken]
) -> None:
    blocks = random_blocks(18)
    tls, token = region_tls if secured else (None, None)

    async def go() -> tuple[list[str], list[dict[str, bytes]], list[list[str]], list[list[str]]]:
        owner_ = Owner(tmp_path / "owner", FakeHub(blocks, delay=0.05), blocks)
        await owner_.start(token, tls)
        askers = [
            await bulk_asker(
                owner_.node, owner_.port, blocks, token=token, tls=tls, stage_in=tmp_path / f"a{i}"
            )
            for i in range(3)
        ]
        wanted = [[d for d in blocks if m.owner(d) == owner_.node] for _, m, _, _ in askers]
        got = await asyncio.gather(
            *(read_all(s, blocks, w) for (s, _, _, _), w in zip(askers, wanted, strict=True))
        )
        again = await read_all(askers[0][0], blocks, wanted[0])  # from the owner's cache now
        assert again == {d: blocks[d] for d in wanted[0]}
        from_hub = [hub.sent for _, _, hub, _ in askers]
        for source, membership, _, _ in askers:
            assert source.bulk is not None
            source.bulk.close()
            await membership.close()
        await owner_.stop()
        return owner_.hub.sent, list(got), wanted, from_hub

    how = "written" if secured else "sendfile"
    before = metrics.PEER_BULK_BYTES.labels(how)._value.get()
    sent, got, wanted, from_hub = asyncio.run(go())
    large = sum(len(blocks[d]) for w in wanted for d in w if len(blocks[d]) > 256 << 10)
    # every large block left by sendfile on the plaintext port, written once under TLS
    assert metrics.PEER_BULK_BYTES.labels(how)._value.get() - before >= large
    for digests, read in zip(wanted, got, strict=True):
        assert digests and read == {d: blocks[d] for d in digests}  # byte for byte
    assert from_hub == [[], [], []]  # every block came from the owner
    assert sorted(sent) == sorted(set(sent)) == sorted({d for w in wanted for d in w})


@contextlib.contextmanager
def _serving(blocks: dict[str, bytes], bad: int, how: str) -> Iterator[int]:
    """A peer's bulk port on 127.0.0.1 that sends block ``bad`` of each request with one
    byte flipped (``corrupt``), one byte more than its size (``oversized``), or half of
    it before the connection ends (``cut``)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # so that the thread sees ``stop``
    stop = threading.Event()

    def exact(conn: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            more = conn.recv(n - len(data))
            if not more:
                raise EOFError
            data += more
        return data

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(10)
            with conn, contextlib.suppress(OSError, EOFError):
                request = bulk.parse_peer_request(exact(conn, bulk.parse_peer_head(exact(conn, 8))))
                out = [bulk.encode_declined([])]
                for i, (digest, _) in enumerate(request.blocks):
                    data = blocks[digest]
                    if i == bad and how == "cut":  # half the block, then the connection ends
                        out += [bulk.encode_block_head(digest, len(data)), data[: len(data) // 2]]
                        break
                    if i == bad:
                        data = (
                            bytes([data[0] ^ 0xFF]) + data[1:] if how == "corrupt" else data + b"!"
                        )
                    out += [bulk.encode_block_head(digest, len(data)), data]
                conn.sendall(b"".join(out))
                if how != "cut":
                    conn.recv(1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        listener.close()
        thread.join(5)


@pytest.mark.parametrize("how", ["corrupt", "oversized", "cut"])
def test_a_bad_block_from_a_peer_is_caught_and_read_from_the_hub(tmp_path: Path, how: str) -> None:
    blocks = random_blocks(24)
    counted = metrics.PEER_CORRUPT_BLOCKS
    kind = {"corrupt": "corrupt", "oversized": "lying", "cut": "unavailable"}[how]

    async def go(port: int) -> tuple[dict[str, bytes], list[str], list[str], bool]:
        node = "127.0.0.1:1"  # its gRPC port is never called: it is live from the start
        source, membership, hub, _ = await bulk_asker(node, port, blocks, stage_in=tmp_path / "a")
        wanted = [d for d in blocks if membership.owner(d) == node]
        got = await read_all(source, blocks, wanted)
        live = node in membership.live
        assert source.bulk is not None
        source.bulk.close()
        await membership.close()
        return got, wanted, hub.sent, live

    corrupt_before = counted._value.get()
    errors_before = metrics.PEER_ERRORS.labels(kind)._value.get()
    with _serving(blocks, 1, how) as port:
        got, wanted, from_hub, live = asyncio.run(go(port))
    assert len(wanted) >= 3
    assert got == {d: blocks[d] for d in wanted}  # not one wrong byte delivered
    assert from_hub == wanted[1:]  # the first came from the peer; the bad one on, the hub
    assert metrics.PEER_ERRORS.labels(kind)._value.get() - errors_before == 1
    assert counted._value.get() - corrupt_before == (1 if how == "corrupt" else 0)
    assert not live  # quarantined (cut: marked down until a probe finds it)
    assert not list((tmp_path / "a").rglob(".tmp-*"))  # nothing staged left behind


def test_the_bulk_peer_port_is_off_by_default_and_not_the_peer_port() -> None:
    from pydantic import ValidationError

    from spoke.mesh.settings import MeshSettings

    base = {"listen": "127.0.0.1:7000", "insecure": True}
    assert MeshSettings(**base).bulk_port == 0  # type: ignore[arg-type]
    assert MeshSettings(**base, bulk_port=7001).bulk_port == 7001  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="is the peer port's"):
        MeshSettings(**base, bulk_port=7000)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        MeshSettings(**base, bulk_port=70_000)  # type: ignore[arg-type]


def test_a_kept_connection_the_owner_closed_is_dialled_again(tmp_path: Path) -> None:
    """The owner's bulk port restarts between two reads: the asker's kept connection is
    gone, the read dials again and still comes from the owner, which stays live."""
    blocks = random_blocks(12)

    async def go() -> tuple[dict[str, bytes], list[str], list[str], bool]:
        owner_ = Owner(tmp_path / "owner", FakeHub(blocks), blocks)
        await owner_.start()
        source, membership, hub, _ = await bulk_asker(owner_.node, owner_.port, blocks)
        wanted = [d for d in blocks if membership.owner(d) == owner_.node]
        half = len(wanted) // 2
        got = await read_all(source, blocks, wanted[:half])
        await owner_.bulk.close()  # its connections end with it
        owner_.bulk = PeerBulkServer(owner_.service.gate, owner_.service.blocks)
        await owner_.bulk.start("127.0.0.1", owner_.port)
        got.update(await read_all(source, blocks, wanted[half:]))
        live = owner_.node in membership.live
        assert source.bulk is not None
        source.bulk.close()
        await membership.close()
        await owner_.stop()
        return got, wanted, hub.sent, live

    got, wanted, from_hub, live = asyncio.run(go())
    assert len(wanted) >= 2 and got == {d: blocks[d] for d in wanted}
    assert from_hub == [] and live
