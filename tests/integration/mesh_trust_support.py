"""What the mesh's trust tests (``tests/integration/test_spoke_mesh_trust*.py``) share: raw
calls to a spoke's peer port as any program holding the region's credentials could make
them (:class:`Peer`), with or without the region token and a grant of its own."""

from __future__ import annotations

import grpc
import grpc.aio

from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2, peer_pb2_grpc
from spoke.mesh.grants import GrantKeeper
from spoke.mesh.peerclient import declined_digests, read_blocks_call
from spoke.mesh.transport import PeerTls, PeerToken
from tests.integration.mesh_support import (
    Region,
)


class Peer:
    """Raw calls to a spoke's peer port, as any program holding the region's credentials
    (and, given a keeper, a grant of its own) could make them."""

    def __init__(self, region: Region, node: str, keeper: GrantKeeper | None = None) -> None:
        self.node = node
        self.keeper = keeper
        tls = PeerTls(
            region.flag("--peer-cert"), region.flag("--peer-key"), region.flag("--peer-ca")
        )
        self.token = PeerToken(region.flag("--peer-token-file"))
        self.channel = grpc.aio.secure_channel(node, tls.channel_credentials())
        self.stub = peer_pb2_grpc.SpokePeerStub(self.channel)

    async def read(
        self,
        blocks: list[tuple[str, int]],
        request_class: str = "demand",
        token: bool = True,
        grant: bool = True,
        snapshots: tuple[tuple[str, str, str], ...] = (),
    ) -> tuple[list[str], dict[str, bytes], list[int]]:
        """Declined digests, blocks served, and each block's announced size.

        Raises:
            grpc.aio.AioRpcError: the call was refused.
        """
        metadata: tuple[tuple[str, str | bytes], ...] = self.token.metadata() if token else ()
        if grant and self.keeper is not None:
            metadata += self.keeper.metadata(self.node, "ReadBlocks")
        request = peer_pb2.PeerReadRequest(
            blocks=[hub_pb2.BlockRef(digest=d, size=s) for d, s in blocks],
            request_class=request_class,
            snapshots=[
                peer_pb2.SnapshotRef(dataset=d, version=v, snapshot_id=i) for d, v, i in snapshots
            ],
        )
        call = read_blocks_call(self.channel)(request, timeout=60, metadata=metadata)
        declined = declined_digests(await call.initial_metadata())
        served: dict[str, bytes] = {}
        sizes = []
        async for chunk in call:
            served[chunk.digest] = served.get(chunk.digest, b"") + chunk.data
            if chunk.last:
                sizes.append(chunk.block_size)
        if not declined and not served:  # all declined: repeated in the trailers
            declined = declined_digests(await call.trailing_metadata())
        return declined, served, sizes

    async def close(self) -> None:
        await self.channel.close()
        if self.keeper is not None:
            await self.keeper.hub.close()
