"""Block replies that make no progress end (hub/limits/budget.py, ``--stall-timeout``), on
127.0.0.1 through real gRPC and the bulk channel: ReadBlocks streams of several tokens that
ask and never read hold the read budget only until the stall deadline, after which another
token is served and ``strata_hub_read_bytes_held`` returns to 0; a stalled stream is
counted (``limit="stall"``), audited, and its client sees RESOURCE_EXHAUSTED naming the
option once it reads; a slow reader that keeps reading gets every byte; a bulk connection
that stalls is closed and its charge given back."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from pathlib import Path

import grpc
import grpc.aio
import pytest

from hub.limits.budget import stalled_charge
from hub.publish.tree import publish
from hub.serve.blockstream import FIRST_MESSAGE_BYTES
from hub.serve.config import ServerConfig
from hub.serve.metrics import HubMetrics
from hub.serve.serverthread import ServerThread
from hub.serve.wire import CHUNK_BYTES
from protocol import bulk
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc
from tests.integration.hub_support import bearer, manifest, write_tree

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20
BLOCK = 4 * MiB  # the default block size: a stream is charged 6 MiB for one
STALLERS = ("stall-a-0123456789abcdef", "stall-b-0123456789abcdef", "stall-c-0123456789abcdef")
READER = "reader-d-0123456789abcdef"
STREAMS_EACH = 3
STALL_S = 2.0

OWN = (("grpc.use_local_subchannel_pool", 1),)
STALL = (*OWN, ("grpc.http2.bdp_probe", 0))
"""A client that never reads: its receive window stays at HTTP/2's 64 KiB, so a 1 MiB
message stays at the hub (see test_hub_budget.py)."""


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("stalls")
    tree = {f"f{i:02d}.bin": os.urandom(BLOCK) for i in range(len(STALLERS) * STREAMS_EACH + 2)}
    publish(base / "hub", "a", write_tree(base / "src", tree))
    return base / "hub"


def _config(tmp_path: Path, **limits: object) -> ServerConfig:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("".join(f'"{token}": ["a"]\n' for token in (*STALLERS, READER)))
    tokens.chmod(0o600)
    return ServerConfig(tokens=tokens, insecure=True, audit_log=tmp_path / "audit.jsonl", **limits)


def _blocks(port: int) -> list[str]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        entries = manifest(hub_pb2_grpc.HubStub(channel), "a", metadata=bearer(READER))
    return [block.digest for _, entry in sorted(entries.items()) for block in entry.blocks]


def _sample(metrics: HubMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def _until(test: object, timeout: float) -> float:
    """Seconds until ``test()`` is true (polled), or fails after ``timeout``."""
    started = time.monotonic()
    while not test():  # type: ignore[operator]
        assert time.monotonic() - started < timeout, f"not within {timeout} s"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


def test_stalled_streams_of_several_tokens_hold_the_budget_only_until_the_stall_deadline(
    data: Path, tmp_path: Path
) -> None:
    """The probe's case scaled down: three tokens' streams fill the hub's budget (two
    tokens' shares) and never read; a fourth token waits, and is served once the stall
    deadline has ended them; the budget is empty again though none of them ever read."""
    metrics = HubMetrics()
    config = _config(
        tmp_path,
        max_bytes_per_token=16 * MiB,  # two 4 MiB streams (6 MiB each) a token
        max_bytes_in_flight=32 * MiB,  # five in all
        stall_timeout_s=STALL_S,
    )
    with ServerThread(data, config=config, metrics=metrics) as server:
        address = f"127.0.0.1:{server.port}"
        digests = _blocks(server.port)

        def held() -> float:
            return _sample(metrics, "strata_hub_read_bytes_held")

        async def probe() -> dict[str, object]:
            channels = [grpc.aio.insecure_channel(address, options=STALL) for _ in STALLERS]
            calls = []
            for number, (token, channel) in enumerate(zip(STALLERS, channels, strict=True)):
                stub = hub_pb2_grpc.HubStub(channel)
                for i in range(STREAMS_EACH):
                    request = hub_pb2.ReadBlocksRequest(digests=[digests[number * 3 + i]])
                    calls.append(stub.ReadBlocks(iter([request]), metadata=bearer(token)))
            started = time.monotonic()
            await _until(lambda: held() >= 30 * MiB, 10)  # the budget is full
            full = held()
            # another token, meanwhile: it waits for room, and gets it at the deadline
            async with grpc.aio.insecure_channel(address, options=OWN) as other:
                call = hub_pb2_grpc.HubStub(other).ReadBlocks(
                    iter([hub_pb2.ReadBlocksRequest(digests=[digests[-1]])]),
                    metadata=bearer(READER),
                    timeout=30,
                )
                asked = time.monotonic()
                got = 0
                async for chunk in call:
                    got += len(chunk.data)
                served_s = time.monotonic() - asked
            # every stalled stream ends; none of their clients has read a byte
            emptied_s = await _until(lambda: held() == 0, 4 * STALL_S + 5) + (
                time.monotonic() - started
            )
            stalled = _sample(metrics, "strata_hub_read_bytes_stalled")
            refusals = _sample(metrics, "strata_hub_limit_refusals_total", limit="stall")
            # a stalled client that reads at last: its message, then the status
            codes, details, first = [], [], []
            for call in calls:
                taken = 0
                with pytest.raises(grpc.aio.AioRpcError) as ended:
                    async for chunk in call:
                        taken += len(chunk.data)
                first.append(taken)
                codes.append(ended.value.code().name)
                details.append(ended.value.details() or "")
            await _until(lambda: _sample(metrics, "strata_hub_read_bytes_stalled") == 0, 10)
            for channel in channels:
                await channel.close()
            return {
                "full": full,
                "got": got,
                "served_s": served_s,
                "emptied_s": emptied_s,
                "stalled": stalled,
                "refusals": refusals,
                "codes": codes,
                "details": details,
                "first": first,
            }

        seen = asyncio.run(probe())
        print(
            f"\nstall probe: {seen['full']:.0f} bytes held, the other token served after "
            f"{seen['served_s']:.2f} s, budget empty after {seen['emptied_s']:.2f} s, "
            f"{seen['stalled']:.0f} bytes left in core by stalled streams"
        )
    assert seen["full"] == 5 * (BLOCK + 2 * CHUNK_BYTES)
    assert seen["got"] == BLOCK
    assert seen["served_s"] < STALL_S + 3  # room at the first deadline, not --budget-wait
    assert seen["codes"] == ["RESOURCE_EXHAUSTED"] * len(STALLERS) * STREAMS_EACH
    assert all("--stall-timeout" in detail for detail in seen["details"])  # type: ignore[attr-defined]
    # the message in core: a stream's first, small (hub.serve.blockstream.MessageRamp), so
    # never reading pins 64 KiB of gRPC core, not a chunk
    assert seen["first"] == [FIRST_MESSAGE_BYTES] * len(STALLERS) * STREAMS_EACH
    # what core keeps for each stalled stream, out of the hub's total: one message each
    bound = len(STALLERS) * STREAMS_EACH * stalled_charge(FIRST_MESSAGE_BYTES + 64)
    assert 0 < seen["stalled"] <= bound  # type: ignore[operator]
    assert seen["refusals"] == len(STALLERS) * STREAMS_EACH
    assert (
        _sample(
            metrics, "strata_hub_requests_total", method="ReadBlocks", code="RESOURCE_EXHAUSTED"
        )
        == len(STALLERS) * STREAMS_EACH
    )
    assert _sample(metrics, "strata_hub_requests_total", method="ReadBlocks", code="CANCELLED") == 0
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    stalls = [r for r in records if "--stall-timeout" in str(r.get("detail"))]
    assert stalls and all(r["what"] == "ReadBlocks" for r in stalls)


def test_a_slow_reader_that_keeps_reading_gets_every_byte(data: Path, tmp_path: Path) -> None:
    """Each message is taken within the stall timeout, the stream as a whole takes several
    times it: progress is timed, not the stream."""
    metrics = HubMetrics()
    config = _config(tmp_path, stall_timeout_s=1.0)
    with ServerThread(data, config=config, metrics=metrics) as server:
        address = f"127.0.0.1:{server.port}"
        digests = _blocks(server.port)[:3]

        async def slowly() -> tuple[int, float]:
            async with grpc.aio.insecure_channel(address, options=STALL) as channel:
                call = hub_pb2_grpc.HubStub(channel).ReadBlocks(
                    iter([hub_pb2.ReadBlocksRequest(digests=digests)]),
                    metadata=bearer(READER),
                    timeout=60,
                )
                started, got = time.monotonic(), 0
                async for chunk in call:
                    got += len(chunk.data)
                    # product interval: a slow reader, 2.5 MiB/s, a message every 0.4 s
                    await asyncio.sleep(0.4)
                return got, time.monotonic() - started

        got, took = asyncio.run(slowly())
        print(f"\nslow reader: {got} bytes in {took:.2f} s with --stall-timeout 1")
    assert got == 3 * BLOCK
    assert took > 3  # the stream lasted three stall timeouts and more
    assert _sample(metrics, "strata_hub_limit_refusals_total", limit="stall") == 0
    assert _sample(metrics, "strata_hub_read_bytes_held") == 0


def _bulk_socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)  # little in the kernel
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    return sock


def test_a_bulk_connection_that_stalls_is_closed_and_a_slow_one_is_served(
    data: Path, tmp_path: Path
) -> None:
    metrics = HubMetrics()
    config = _config(tmp_path, stall_timeout_s=1.0, bulk_port=0)
    with ServerThread(data, config=config, metrics=metrics) as server:
        assert server.server.bulk is not None
        port = server.server.bulk.port
        digests = _blocks(server.port)

        async def probe() -> tuple[float, float, int, int, float]:
            stalled = _bulk_socket(port)
            stalled.sendall(bulk.encode_request(STALLERS[0], digests[:6]))
            started = time.monotonic()
            await _until(lambda: _sample(metrics, "strata_hub_read_bytes_held") > 0, 10)
            await _until(lambda: _sample(metrics, "strata_hub_read_bytes_held") == 0, 20)
            closed_s = time.monotonic() - started
            refusals = _sample(metrics, "strata_hub_limit_refusals_total", limit="stall")
            taken = 0
            try:
                while part := await asyncio.to_thread(stalled.recv, 1 << 20):
                    taken += len(part)
            except ConnectionResetError:
                pass  # closed with bytes unread: a reset
            stalled.close()
            # a slow reader: at most 64 KiB (its receive buffer) every 0.1 s, so a step of
            # 1 MiB takes longer than the stall timeout, and the block several times it
            slow = _bulk_socket(port)
            slow.sendall(bulk.encode_request(READER, digests[:1]))
            started, got = time.monotonic(), 0
            while got < bulk.BLOCK_HEAD.size + BLOCK:
                part = await asyncio.to_thread(slow.recv, 256 * 1024)
                assert part, f"closed after {got} bytes"
                got += len(part)
                await asyncio.sleep(0.1)  # product interval: the slow reader's pace
            slow.close()
            return closed_s, refusals, taken, got, time.monotonic() - started

        closed_s, refusals, taken, got, took = asyncio.run(probe())
        print(
            f"\nbulk: stalled connection closed after {closed_s:.2f} s ({taken} bytes reached "
            f"it); slow reader {got} bytes in {took:.2f} s with --stall-timeout 1"
        )
    assert closed_s < 2 * 1.0 + 3  # a stall is seen within two stall timeouts
    assert refusals == 1
    assert taken < 6 * BLOCK
    assert got == bulk.BLOCK_HEAD.size + BLOCK
    assert took > 3 * 1.0
    assert _sample(metrics, "strata_hub_limit_refusals_total", limit="stall") == 1
    assert _sample(metrics, "strata_hub_read_bytes_held") == 0


def test_clients_that_cancel_mid_stream_are_counted_cancelled_and_leave_nothing_held(
    data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ReadBlocks writes its own messages now: a call that ends under a write (the client
    cancels, or closes its connection) ends quietly, as grpc.aio ends a cancelled call."""
    metrics = HubMetrics()
    with ServerThread(data, config=_config(tmp_path), metrics=metrics) as server:
        address = f"127.0.0.1:{server.port}"
        digests = _blocks(server.port)[:4]

        async def cancelling() -> None:
            for i in range(20):
                channel = grpc.aio.insecure_channel(address, options=OWN)
                call = hub_pb2_grpc.HubStub(channel).ReadBlocks(
                    iter([hub_pb2.ReadBlocksRequest(digests=digests)]), metadata=bearer(READER)
                )
                taken = 0
                async for _ in call:
                    taken += 1
                    if taken == 2 + i % 5:
                        break
                call.cancel()
                if i % 2:
                    await channel.close()
            await _until(  # the hub has ended every call and given back what it held
                lambda: (
                    _sample(
                        metrics, "strata_hub_requests_total", method="ReadBlocks", code="CANCELLED"
                    )
                    >= 20
                    and _sample(metrics, "strata_hub_read_bytes_held") == 0
                ),
                10,
            )

        asyncio.run(cancelling())
        held = _sample(metrics, "strata_hub_read_bytes_held")
    assert held == 0
    codes = {
        code: _sample(metrics, "strata_hub_requests_total", method="ReadBlocks", code=code)
        for code in ("CANCELLED", "INTERNAL", "OK")
    }
    assert codes == {"CANCELLED": 20, "INTERNAL": 0, "OK": 0}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_bulk_connections_of_a_token_over_its_fair_share_give_way_to_a_lighter_one(
    data: Path, tmp_path: Path
) -> None:
    """Issue 39's third probe: two tokens' bulk connections that took a few bytes now and
    then held the whole budget, refusing everyone else's reads; while a lighter token
    waits, a heavier token's step gets 2 s, not the stall timeout."""
    metrics = HubMetrics()
    config = _config(
        tmp_path,
        stall_timeout_s=30.0,
        bulk_port=0,
        max_bytes_per_token=16 * MiB,  # four 4 MiB blocks
        max_bytes_in_flight=16 * MiB,
    )
    with ServerThread(data, config=config, metrics=metrics) as server:
        assert server.server.bulk is not None
        port = server.server.bulk.port
        digests = _blocks(server.port)

        async def probe() -> tuple[int, float]:
            held = []
            for i in range(4):  # never read: each holds its block's 4 MiB
                sock = _bulk_socket(port)
                sock.sendall(bulk.encode_request(STALLERS[0], digests[i * 2 : i * 2 + 2]))
                held.append(sock)
            await _until(lambda: _sample(metrics, "strata_hub_read_bytes_held") >= 16 * MiB, 10)
            reader = _bulk_socket(port)
            reader.sendall(bulk.encode_request(READER, digests[-1:]))
            started, got = time.monotonic(), 0
            while got < bulk.BLOCK_HEAD.size + BLOCK:
                part = await asyncio.to_thread(reader.recv, 1 << 20)
                assert part, f"closed after {got} bytes"
                got += len(part)
            took = time.monotonic() - started
            reader.close()
            for sock in held:
                sock.close()
            return got, took

        got, took = asyncio.run(probe())
        print(f"\nbulk: a lighter token served after {took:.2f} s (stall timeout 30 s)")
    assert got == bulk.BLOCK_HEAD.size + BLOCK
    assert took < 10  # not --budget-wait's refusal, nor the 30 s stall timeout
    assert _sample(metrics, "strata_hub_limit_refusals_total", limit="stall") >= 1
