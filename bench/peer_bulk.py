"""A peer transfer over the peer port's gRPC and over the bulk peer port, side by side.

    python -m bench.peer_bulk [--size 256MiB] [--block-size 4MiB] [--batch 16] [--json FILE]

One process on 127.0.0.1: an owner spoke (its gRPC peer port and its bulk peer port, one
admission behind both, ``spoke.mesh.peercall``) holding ``--size`` bytes of blocks in its
cache, and an asker reading all of them ``--batch`` blocks a call, each to a verified
temporary block file on its own disk (``BlockStore.stage``, as the fetcher keeps them):
over gRPC the asker verifies and writes the bytes it got, over bulk its receive threads do.
Each transport runs plaintext (bulk: ``sendfile``) and under mTLS with the region token,
after one warm-up pass that fills the owner's cache. Reported per run: MB/s and the
process's CPU-seconds per GiB (owner and asker together: both live in this process).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from deploy.local import free_port
from deploy.pki import LocalCa
from hub.auth.grants import GrantIssuer
from hub.auth.tokens import Principal
from protocol.hub.v1 import hub_pb2
from spoke.cache.blockcache import BlockCache
from spoke.cache.lru import LRUPolicy
from spoke.cache.staging import Staged
from spoke.cache.store import BlockStore, Received, open_index
from spoke.catalog.catalog import SnapshotCatalog
from spoke.disk.layout import CacheLayout, block_digest
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.scheduler import FetchScheduler, Priority
from spoke.hublink.client import HubClient
from spoke.mesh.admission import ScopeCheck
from spoke.mesh.bulkclient import PeerBulkClient
from spoke.mesh.grantcheck import GrantVerifier
from spoke.mesh.grants import GrantKeeper, HubGrantKeys
from spoke.mesh.membership import Membership
from spoke.mesh.peerbulk import PeerBulkServer
from spoke.mesh.peerclient import PeerClient
from spoke.mesh.peerservice import PeerService, start_peer_server
from spoke.mesh.source import MeshSource
from spoke.mesh.transport import PeerTls, PeerToken

MiB = 1 << 20
ISSUER = GrantIssuer(Ed25519PrivateKey.generate())


@dataclass
class Result:
    """One pass of every block from the owner to the asker."""

    transport: str
    secured: bool
    nbytes: int
    wall_s: float
    cpu_s: float

    @property
    def mb_s(self) -> float:
        return self.nbytes / self.wall_s / 1e6

    @property
    def cpu_s_per_gib(self) -> float:
        return self.cpu_s / (self.nbytes / (1 << 30))


class _Hub:
    """The owner's hub: blocks from a dict (read once, in the warm-up pass)."""

    name = "hub:0"

    def __init__(self, blocks: dict[str, bytes]) -> None:
        self.blocks = blocks

    async def read_blocks(
        self, blocks: Sequence[tuple[str, int]], timeout: float, priority: Priority
    ) -> AsyncIterator[tuple[str, bytes]]:
        for digest, _ in blocks:
            yield digest, self.blocks[digest]


class _Granting:
    async def issue_grant(self, holder_key: bytes, node: str) -> hub_pb2.ReadGrant:
        request = hub_pb2.IssueGrantRequest(holder_key=holder_key, node=node)
        return ISSUER.issue(Principal("bench", ("*",)), request)


def _cache(root: Path) -> tuple[BlockCache, SnapshotCatalog]:
    layout = CacheLayout(root)
    env = open_index(layout)
    cache = BlockCache(BlockStore(layout, env), LRUPolicy(8 << 30), 8 << 30)
    return cache, SnapshotCatalog(HubClient("127.0.0.1:1"), env)


def _hold(catalog: SnapshotCatalog, blocks: dict[str, bytes]) -> None:
    """Record ``blocks`` as one file of a live snapshot of ``ds`` (what the owner serves)."""
    entry = hub_pb2.ManifestEntry(
        path="f",
        type=hub_pb2.ENTRY_TYPE_FILE,
        blocks=[hub_pb2.BlockRef(digest=d, size=len(b)) for d, b in blocks.items()],
    )
    sid = block_digest("".join(blocks).encode())
    with catalog._env.begin(write=True) as txn:
        catalog.scope.index(txn, sid, [entry])
    catalog.scope.add_name(sid, "ds", "v1")


async def _run(root: Path, blocks: dict[str, bytes], batch: int) -> list[Result]:
    (root / "pki").mkdir()
    ca = LocalCa(root / "pki", "region-ca")
    leaf = ca.issue("spokes")
    (root / "token").write_text("bench-region-token-0123456789\n")
    tls, token = PeerTls(leaf.cert, leaf.key, ca.cert), PeerToken(root / "token")
    keys = HubGrantKeys(None, pinned=Ed25519PublicKey.from_public_bytes(ISSUER.public_key))
    results = []
    for secured in (False, True):
        peer_tls, peer_token = (tls, token) if secured else (None, None)
        cache, catalog = _cache(root / f"owner-{secured}")
        _hold(catalog, blocks)
        node = f"127.0.0.1:{free_port()}"
        source = MeshSource(_Hub(blocks), Membership(node))
        scheduler = FetchScheduler(Fetcher(source), cache)
        service = PeerService(
            node, cache, scheduler, source, GrantVerifier(node, keys), ScopeCheck(catalog),
            token=peer_token,
        )  # fmt: skip
        server, _ = await start_peer_server(service, node, peer_tls)
        bulk_server = PeerBulkServer(service.gate, service.blocks, peer_tls)
        port = await bulk_server.start("127.0.0.1", 0)
        me = f"127.0.0.1:{free_port()}"
        keeper = GrantKeeper(_Granting(), me)  # type: ignore[arg-type]
        await keeper.fetch()
        asker, _ = _cache(root / f"asker-{secured}")
        grpc_client = PeerClient(node, peer_token, peer_tls, keeper)
        bulk_client = PeerBulkClient(port, peer_token, peer_tls, keeper, asker.store.stage)
        sized = [(d, len(b)) for d, b in blocks.items()]

        def read(bulk: bool, part: list[tuple[str, int]]) -> AsyncIterator[tuple[str, Received]]:
            if bulk:
                return bulk_client.read_blocks(node, part, "demand", 60, 10)  # noqa: B023
            return grpc_client.read_blocks(part, "demand", 60, 10)  # noqa: B023

        await _pass(read, False, sized, batch, asker.store)  # the owner fetches and keeps all
        for bulk in (False, True):
            start, used = time.monotonic(), _cpu()
            nbytes = await _pass(read, bulk, sized, batch, asker.store)
            wall, cpu = time.monotonic() - start, _cpu() - used
            results.append(Result("bulk" if bulk else "grpc", secured, nbytes, wall, cpu))
        bulk_client.close()
        await grpc_client.close()
        await bulk_server.close()
        await server.stop(0)
        await scheduler.close()
    return results


Read = Callable[[bool, list[tuple[str, int]]], AsyncIterator[tuple[str, Received]]]


async def _pass(
    read: Read, bulk: bool, sized: list[tuple[str, int]], batch: int, store: BlockStore
) -> int:
    """Every block through ``read`` (over bulk or gRPC), ``batch`` a call, each to a
    verified temporary block file; returns the bytes."""
    got = 0
    for i in range(0, len(sized), batch):
        async for digest, data in read(bulk, sized[i : i + batch]):
            if not isinstance(data, Staged):  # what the fetcher does with bytes
                assert block_digest(data) == digest
                data = await asyncio.to_thread(store.stage, digest, memoryview(data), False)
            got += data.size
            data.discard()
    return got


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def markdown(results: list[Result]) -> str:
    """The runs as a Markdown table."""
    lines = [
        "| transport | TLS + token | MB/s | CPU-s per GiB (owner + asker) |",
        "|---|---|---|---|",
    ]
    for r in results:
        secured = "mTLS" if r.secured else "plaintext"
        lines.append(f"| {r.transport} | {secured} | {r.mb_s:,.0f} | {r.cpu_s_per_gib:.2f} |")
    return "\n".join(lines)


def _size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def main(argv: list[str] | None = None) -> None:
    """Runs the bench (see the module docstring); exit status 2 for bad arguments."""
    parser = argparse.ArgumentParser(prog="python -m bench.peer_bulk", description=__doc__)
    parser.add_argument("--size", default="256MiB", help="bytes of blocks (default 256MiB)")
    parser.add_argument("--block-size", default="4MiB", help="bytes a block (default 4MiB)")
    parser.add_argument("--batch", type=int, default=16, help="blocks a call (default 16)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    try:
        size, block = _size(args.size), _size(args.block_size)
    except ValueError:
        parser.error("--size and --block-size are bytes, or a number with KiB, MiB or GiB")
    if not 0 < block <= size or not 0 < args.batch <= 256:
        parser.error("need 0 < --block-size <= --size and 1 <= --batch <= 256")
    blocks = {}
    for _ in range(size // block):
        data = os.urandom(block)
        blocks[block_digest(data)] = data
    with tempfile.TemporaryDirectory(prefix="peer-bulk-") as tmp:
        results = asyncio.run(_run(Path(tmp), blocks, args.batch))
    print(markdown(results))
    if args.json is not None:
        rows = [{**asdict(r), "mb_s": r.mb_s, "cpu_s_per_gib": r.cpu_s_per_gib} for r in results]
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
