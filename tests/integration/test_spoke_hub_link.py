"""The spoke's hub connection over a link that goes silent (bench/wan.py's blackhole)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import grpc
import grpc.aio
import pytest

from bench.wan import LinkSpec, WanProxy
from deploy.local import LocalStack
from spoke.hublink.client import HubClient
from tests.support import publish


def test_a_blackholed_connection_is_found_dead_by_keepalive(tmp_path: Path) -> None:
    """Issue 17 item 4: a stream on a connection that stopped answering fails UNAVAILABLE
    once keepalive pings go unanswered (then it is retried on a new connection), not at
    its own deadline (DEADLINE_EXCEEDED) as it did with the pings effectively off."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a" * 1000)
    publish(tmp_path / "hub", "ds", src)
    with LocalStack() as stack:
        hub = stack.start_hub(tmp_path / "hub")
        host, port = hub.rsplit(":", 1)
        with WanProxy((host, int(port)), LinkSpec(rtt_s=0.0, rate_bps=math.inf)) as wan:

            async def go() -> grpc.StatusCode:
                client = HubClient(wan.address, keepalive=1.0, keepalive_timeout=1.0)
                try:
                    assert [d.name for d in (await client.list_datasets()).datasets] == ["ds"]
                    wan.cut("blackhole")
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        async for _ in client.read_blocks(["0" * 32], timeout=45.0):
                            pass
                    return info.value.code()
                finally:
                    await client.close()

            assert asyncio.run(go()) == grpc.StatusCode.UNAVAILABLE
