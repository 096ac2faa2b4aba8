"""What the bulk peer port's tests (``tests/component/test_spoke_mesh_bulk*.py``) share: an
owner spoke's gRPC and bulk peer ports over a fake hub (:class:`Owner`, its refusals kept
by :class:`Audit`), an asker's mesh source reading that owner over bulk, random blocks, and
the region's certificates and peer token (the ``region_tls`` fixture; import
``region_tls_fixture`` to use it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.local import free_port
from deploy.pki import LocalCa
from hub.auth.tokens import Principal
from spoke.cache.staging import Staged
from spoke.cache.store import Received
from spoke.disk.layout import block_digest
from spoke.fetch.scheduler import Priority
from spoke.mesh.admission import CallerLimits, Refusals
from spoke.mesh.bulkclient import PeerBulkClient
from spoke.mesh.grants import GrantKeeper
from spoke.mesh.membership import Membership
from spoke.mesh.peerbulk import PeerBulkServer
from spoke.mesh.peerclient import PeerClient
from spoke.mesh.source import MeshSource
from spoke.mesh.transport import PeerTls, PeerToken
from tests.component import mesh_source_support
from tests.component.mesh_source_support import (
    EVERYTHING,
    FakeHub,
    _cache,
    _keeper,
    _live,
)


def random_blocks(n: int, seed: int = 0) -> dict[str, bytes]:
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


class Owner(mesh_source_support.Owner):
    """A spoke's gRPC and bulk peer ports over a fake hub, holding ``blocks`` as a snapshot
    of ``ds``; one admission (:class:`~spoke.mesh.peercall.PeerGate`) behind both, its
    refusals kept in :attr:`audit`."""

    def __init__(self, root: Path, hub: FakeHub, blocks: dict[str, bytes]) -> None:
        self.audit = Audit()
        super().__init__(root, hub, blocks, Refusals(self.audit))  # type: ignore[arg-type]

    async def start(
        self,
        token: PeerToken | None = None,
        tls: PeerTls | None = None,
        limits: CallerLimits | None = None,
    ) -> None:
        await super().start(token, tls, limits)
        self.bulk = PeerBulkServer(self.service.gate, self.service.blocks, tls)
        self.port = await self.bulk.start("127.0.0.1", 0)

    async def stop(self) -> None:
        await self.bulk.close()
        await super().stop()


def _data(got: Received) -> bytes:
    if isinstance(got, Staged):
        data = Path(got.path).read_bytes()
        got.discard()
        return data
    return got


async def bulk_asker(
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


async def read_all(
    source: MeshSource, blocks: dict[str, bytes], digests: list[str]
) -> dict[str, bytes]:
    sized = [(d, len(blocks[d])) for d in digests]
    return {d: _data(b) async for d, b in source.read_blocks(sized, 10, Priority.DEMAND)}


@pytest.fixture(name="region_tls")
def region_tls_fixture(tmp_path: Path) -> Iterator[tuple[PeerTls, PeerToken]]:
    (tmp_path / "region").mkdir()
    ca = LocalCa(tmp_path / "region", "region-ca")
    leaf = ca.issue("spokes")
    token = tmp_path / "peer-token"
    token.write_text("region-token-0123456789abcdef\n")
    yield PeerTls(leaf.cert, leaf.key, ca.cert), PeerToken(token)
