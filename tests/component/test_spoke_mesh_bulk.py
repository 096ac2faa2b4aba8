"""The bulk peer port (``--peer-bulk-port``) in one process, on real sockets of 127.0.0.1:
an owner serves its peers' reads by ``sendfile`` (plaintext) or under mTLS with the region
token, fetching each block from the hub once for every asker; what the gRPC peer port
refuses (no token, a wrong one, no grant, a caller over its limits) or declines (a grant
outside the dataset's scope) it refuses or declines with the same status, message and
audit record, and the asker reads those blocks from the hub; a corrupt, oversized or cut
block from a peer is caught and read from the hub, and the peer leaves the mesh; renewed
certificates are used without a restart; connections over the cap and requests late or
malformed are answered and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.local import free_port
from deploy.pki import LocalCa
from hub.auth.tokens import Principal
from protocol import bulk
from spoke.cache.staging import Staged
from spoke.cache.store import Received
from spoke.disk.layout import block_digest
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.scheduler import FetchScheduler, Priority
from spoke.mesh import metrics
from spoke.mesh.admission import CallerLimits, Refusals, ScopeCheck
from spoke.mesh.bulkclient import PeerBulkClient
from spoke.mesh.grantcheck import GrantVerifier
from spoke.mesh.grants import GrantKeeper
from spoke.mesh.membership import Membership
from spoke.mesh.peerbulk import PeerBulkServer
from spoke.mesh.peerclient import PeerClient, PeerError
from spoke.mesh.peerservice import PeerService, start_peer_server
from spoke.mesh.source import MeshSource
from spoke.mesh.transport import PeerTls, PeerToken
from tests.component.test_spoke_mesh_source import (
    EVERYTHING,
    FakeHub,
    _cache,
    _hold,
    _keeper,
    _keys,
    _live,
)
from tests.support import eventually_async

pytestmark = pytest.mark.timeout(60)


def _blocks(n: int, seed: int = 0) -> dict[str, bytes]:
    """``n`` random blocks: most larger than a serve chunk (sent by ``sendfile``), some
    smaller (sent as read)."""
    out = {}
    for i in range(n):
        data = os.urandom(300_000 + 7 * i if i % 3 else 5_000 + i + seed)
        out[block_digest(data)] = data
    return out


class Audit:
    """An audit log that keeps the refusals it is given."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def refused(self, **fields: Any) -> None:
        self.records.append(fields)


def _same(record: dict[str, Any]) -> dict[str, Any]:
    """An audit record less the caller's port (each call has its own connection)."""
    who = str(record["who"])
    return {**record, "who": who.rpartition(":")[0]}


class Owner:
    """A spoke's gRPC and bulk peer ports over a fake hub, holding ``blocks`` as a snapshot
    of ``ds``; one admission (:class:`~spoke.mesh.peercall.PeerGate`) behind both."""

    def __init__(self, root: Path, hub: FakeHub, blocks: dict[str, bytes]) -> None:
        self.root, self.hub, self.blocks = root, hub, blocks
        self.node = f"127.0.0.1:{free_port()}"
        self.audit = Audit()

    async def start(
        self,
        token: PeerToken | None = None,
        tls: PeerTls | None = None,
        limits: CallerLimits | None = None,
    ) -> None:
        cache, catalog = _cache(self.root)
        _hold(catalog, "ds", self.blocks)
        source = MeshSource(self.hub, Membership(self.node))
        self.scheduler = FetchScheduler(Fetcher(source), cache)
        service = PeerService(
            self.node,
            cache,
            self.scheduler,
            source,
            GrantVerifier(self.node, _keys()),
            ScopeCheck(catalog),
            token=token,
            limits=limits,
            refusals=Refusals(self.audit),  # type: ignore[arg-type]
        )
        self.service = service
        self.server, _ = await start_peer_server(service, self.node, tls)
        self.bulk = PeerBulkServer(service.gate, service.blocks, tls)
        self.port = await self.bulk.start("127.0.0.1", 0)

    async def stop(self) -> None:
        await self.bulk.close()
        await self.server.stop(0)
        await self.scheduler.close()


def _data(got: Received) -> bytes:
    if isinstance(got, Staged):
        data = Path(got.path).read_bytes()
        got.discard()
        return data
    return got


async def _asker(
    node: str,
    port: int,
    blocks: dict[str, bytes],
    principal: Principal = EVERYTHING,
    token: PeerToken | None = None,
    tls: PeerTls | None = None,
    stage_in: Path | None = None,
    granted: bool = True,
) -> tuple[MeshSource, Membership, FakeHub, GrantKeeper]:
    """A mesh source whose peer ``node`` is live, read over its bulk ``port``."""
    me = f"127.0.0.1:{free_port()}"
    keeper = await _keeper(me, principal)
    membership = Membership(me, [node], connect=lambda n: PeerClient(n, token, tls, keeper))
    await membership.refresh()  # its client made (the probe's answer does not matter)
    _live(membership, node)
    stage = _cache(stage_in)[0].store.stage if stage_in is not None else None
    client = PeerBulkClient(port, token, tls, keeper if granted else None, stage)
    hub = FakeHub(blocks)
    return MeshSource(hub, membership, grants=keeper, bulk=client), membership, hub, keeper


async def _read(
    source: MeshSource, blocks: dict[str, bytes], digests: list[str]
) -> dict[str, bytes]:
    sized = [(d, len(blocks[d])) for d in digests]
    return {d: _data(b) async for d, b in source.read_blocks(sized, 10, Priority.DEMAND)}


@pytest.fixture
def region_tls(tmp_path: Path) -> Iterator[tuple[PeerTls, PeerToken]]:
    (tmp_path / "region").mkdir()
    ca = LocalCa(tmp_path / "region", "region-ca")
    leaf = ca.issue("spokes")
    token = tmp_path / "peer-token"
    token.write_text("region-token-0123456789abcdef\n")
    yield PeerTls(leaf.cert, leaf.key, ca.cert), PeerToken(token)


@pytest.mark.parametrize("secured", [False, True], ids=["sendfile", "mtls-token"])
def test_bytes_through_a_peer_over_bulk_are_the_hubs_and_fetched_once(
    tmp_path: Path, secured: bool, region_tls: tuple[PeerTls, PeerToken]
) -> None:
    blocks = _blocks(18)
    tls, token = region_tls if secured else (None, None)

    async def go() -> tuple[list[str], list[dict[str, bytes]], list[list[str]], list[list[str]]]:
        owner_ = Owner(tmp_path / "owner", FakeHub(blocks, delay=0.05), blocks)
        await owner_.start(token, tls)
        askers = [
            await _asker(
                owner_.node, owner_.port, blocks, token=token, tls=tls, stage_in=tmp_path / f"a{i}"
            )
            for i in range(3)
        ]
        wanted = [[d for d in blocks if m.owner(d) == owner_.node] for _, m, _, _ in askers]
        got = await asyncio.gather(
            *(_read(s, blocks, w) for (s, _, _, _), w in zip(askers, wanted, strict=True))
        )
        again = await _read(askers[0][0], blocks, wanted[0])  # from the owner's cache now
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
    blocks = _blocks(9)
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
        source, membership, hub, _ = await _asker(
            owner_.node,
            owner_.port,
            blocks,
            principal,
            presented,
            tls,
            granted=case != "no grant",
        )
        wanted = [d for d in blocks if membership.owner(d) == owner_.node]
        got = await _read(source, blocks, wanted)
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
    blocks = _blocks(24)
    counted = metrics.PEER_CORRUPT_BLOCKS
    kind = {"corrupt": "corrupt", "oversized": "lying", "cut": "unavailable"}[how]

    async def go(port: int) -> tuple[dict[str, bytes], list[str], list[str], bool]:
        node = "127.0.0.1:1"  # its gRPC port is never called: it is live from the start
        source, membership, hub, _ = await _asker(node, port, blocks, stage_in=tmp_path / "a")
        wanted = [d for d in blocks if membership.owner(d) == node]
        got = await _read(source, blocks, wanted)
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
    blocks = _blocks(2)

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
        held = socket.create_connection(("127.0.0.1", capped_port))
        await eventually_async(lambda: len(capped._open) == 1, "the first connection open there")
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


def test_a_kept_connection_the_owner_closed_is_dialled_again(tmp_path: Path) -> None:
    """The owner's bulk port restarts between two reads: the asker's kept connection is
    gone, the read dials again and still comes from the owner, which stays live."""
    blocks = _blocks(12)

    async def go() -> tuple[dict[str, bytes], list[str], list[str], bool]:
        owner_ = Owner(tmp_path / "owner", FakeHub(blocks), blocks)
        await owner_.start()
        source, membership, hub, _ = await _asker(owner_.node, owner_.port, blocks)
        wanted = [d for d in blocks if membership.owner(d) == owner_.node]
        half = len(wanted) // 2
        got = await _read(source, blocks, wanted[:half])
        await owner_.bulk.close()  # its connections end with it
        owner_.bulk = PeerBulkServer(owner_.service.gate, owner_.service.blocks)
        await owner_.bulk.start("127.0.0.1", owner_.port)
        got.update(await _read(source, blocks, wanted[half:]))
        live = owner_.node in membership.live
        assert source.bulk is not None
        source.bulk.close()
        await membership.close()
        await owner_.stop()
        return got, wanted, hub.sent, live

    got, wanted, from_hub, live = asyncio.run(go())
    assert len(wanted) >= 2 and got == {d: blocks[d] for d in wanted}
    assert from_hub == [] and live
