"""What one token may make the hub hold, on 127.0.0.1 through real gRPC: streams that ask
for blocks and never read them hold the hub's memory to the token's share of the read
budget (a hub subprocess, its RSS measured) while another token's reads go on; a token
over its stream cap is refused at once; IssueGrant gives one token grants for a bounded
number of holder keys, each renewed a bounded number of times per lifetime. Every refusal
is RESOURCE_EXHAUSTED with a message naming the flag, counted and audited."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from deploy.local import LocalStack, free_port
from hub.auth.tokens import hash_token
from hub.limits.budget import BYTES_PER_TOKEN, block_charge
from hub.limits.streams import LISTING_CALLS, TOKEN_SHARE, UNARY_CALLS
from hub.publish.tree import publish
from hub.serve import gate, inbound
from hub.serve.config import ServerConfig
from hub.serve.metrics import HubMetrics
from hub.serve.serverthread import ServerThread
from hub.serve.wire import CHUNK_BYTES
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc
from tests.integration.hub_support import RPC_TIMEOUT, bearer, write_tree
from tests.support import eventually_async

pytestmark = pytest.mark.timeout(300)

TOKEN_A = "tenant-a-reader-0123456789abcdef"
TOKEN_B = "tenant-b-reader-fedcba9876543210"
BLOCK = 4 << 20  # the default block size: what a stalled stream pins
STALLED = 256  # the probe's: 2 connections x 128 streams
MiB = 1 << 20
# the hub at rest (~75 MiB) + the token's share (192 MiB) + streams' state and the
# allocator's slack; without the budget these streams took it past 1,400 MiB
RSS_BOUND_MIB = 75 + BYTES_PER_TOKEN // MiB + 150
# a stream holding a 4 MiB block is charged 6 MiB (hub.limits.budget.block_charge)
HELD = BYTES_PER_TOKEN // block_charge(BLOCK, CHUNK_BYTES)


OWN = (("grpc.use_local_subchannel_pool", 1),)
"""Channel options for a connection of its own (gRPC shares one between channels to the
same address otherwise): each tenant is another client."""


STALL = (*OWN, ("grpc.http2.bdp_probe", 0))
"""A client that never reads: without bandwidth probes its receive window stays at HTTP/2's
64 KiB, so what it does not read stays at the hub (with them, gRPC takes the blocks into
the client's own buffers, and the hub sees them read)."""


def _tokens(root: Path) -> Path:
    path = root / "tokens.yaml"
    path.write_text(f'"{TOKEN_A}": ["a"]\n"{TOKEN_B}": ["b"]\n')
    path.chmod(0o600)
    return path


def _publish(root: Path, files: int) -> Path:
    data = root / "hub"
    for name in ("a", "b"):
        tree = {f"{name}{i}.bin": os.urandom(BLOCK) for i in range(files)}
        publish(data, name, write_tree(root / f"src-{name}", tree))
    return data


def _blocks(stub: hub_pb2_grpc.HubStub, dataset: str, token: str) -> list[tuple[str, int]]:
    blocks: list[tuple[str, int]] = []
    request = hub_pb2.GetManifestRequest(dataset=dataset, ref="latest")
    for entry in stub.GetManifest(request, timeout=RPC_TIMEOUT, metadata=bearer(token)):
        blocks += [(block.digest, block.size) for block in entry.blocks]
    return blocks


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def _metric(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _audited(path: Path, outcome: str) -> list[dict[str, object]]:
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [record for record in records if record.get("outcome") == outcome]


async def _read_whole(stub: hub_pb2_grpc.HubStub, digest: str, token: str) -> int:
    call = stub.ReadBlocks(
        iter([hub_pb2.ReadBlocksRequest(digests=[digest])]), metadata=bearer(token), timeout=30
    )
    got = 0
    async for chunk in call:
        got += len(chunk.data)
    return got


def test_stalled_streams_of_one_token_hold_its_share_and_another_token_reads_on(
    tmp_path: Path,
) -> None:
    data = _publish(tmp_path, files=8)
    metrics_port = free_port()
    audit = tmp_path / "audit.jsonl"
    with LocalStack() as stack:
        address = stack.start_hub(
            data,
            metrics=f"127.0.0.1:{metrics_port}",
            extra=(
                *("--tokens", str(_tokens(tmp_path)), "--insecure"),
                *("--audit-log", str(audit), "--budget-wait", "3"),
            ),
        )
        assert stack.hub is not None
        pid = stack.hub.pid
        with grpc.insecure_channel(address) as channel:
            stub = hub_pb2_grpc.HubStub(channel)
            blocks_a = _blocks(stub, "a", TOKEN_A)
            blocks_b = _blocks(stub, "b", TOKEN_B)
        assert all(size == BLOCK for _, size in blocks_a)
        rest = _rss_mib(pid)

        async def attack() -> tuple[float, float, int, float, dict[str, int], list[str], float]:
            channels = [grpc.aio.insecure_channel(address, options=STALL) for _ in range(2)]
            calls = []
            for number, channel in enumerate(channels):
                stub = hub_pb2_grpc.HubStub(channel)
                for i in range(STALLED // len(channels)):
                    digest, _ = blocks_a[(number * STALLED + i) % len(blocks_a)]
                    request = hub_pb2.ReadBlocksRequest(digests=[digest])
                    calls.append(
                        stub.ReadBlocks(iter([request]), metadata=bearer(TOKEN_A), timeout=60)
                    )
            charged = HELD * block_charge(BLOCK, CHUNK_BYTES)

            def asked() -> bool:  # every stream is at the hub, the token's share held
                streams = _metric(metrics_port, 'strata_hub_active_streams{method="ReadBlocks"}')
                held = _metric(metrics_port, "strata_hub_read_bytes_held")
                return streams >= STALLED and held >= charged

            await eventually_async(
                lambda: asyncio.to_thread(asked), "every stream has asked; none reads"
            )
            held = _metric(metrics_port, "strata_hub_read_bytes_held")
            peak = _rss_mib(pid)
            # another tenant, on its own connection, meanwhile
            async with grpc.aio.insecure_channel(address, options=OWN) as other:
                started = time.monotonic()
                got = await _read_whole(hub_pb2_grpc.HubStub(other), blocks_b[0][0], TOKEN_B)
                took = time.monotonic() - started

            # the streams holding a charge stall on their first message and are ended
            # (hub.limits.budget.ReadBudget.send_deadline; their status waits in gRPC core
            # behind that message until the client reads), the waiters take their room
            # in turn, and past --budget-wait the streams still waiting give up
            def ended() -> tuple[float] | None:  # every call ended or stalled
                nonlocal peak
                peak = max(peak, _rss_mib(pid))
                stalled = _metric(metrics_port, 'strata_hub_limit_refusals_total{limit="stall"}')
                return (stalled,) if sum(c.done() for c in calls) + stalled >= len(calls) else None

            (stalled,) = await eventually_async(ended, "every call ended or stalled", interval=0.2)
            codes: dict[str, int] = {}
            details = []
            for call in calls:
                if call.done():
                    code = (await call.code()).name
                    codes[code] = codes.get(code, 0) + 1
                    details.append(await call.details() or "")
                call.cancel()
            for channel in channels:
                await channel.close()
            return held, peak, got, took, codes, details, stalled

        held, peak, got, took, codes, details, stalled = asyncio.run(attack())
        waited = _metric(metrics_port, 'strata_hub_limit_refusals_total{limit="bytes"}')
    assert held <= BYTES_PER_TOKEN
    assert peak < RSS_BOUND_MIB, f"hub RSS {rest:.0f} -> {peak:.0f} MiB"
    assert got == BLOCK and took < 5
    # each stream either held a charge until it stalled (at least the first share's
    # worth) or waited for room and was refused
    assert stalled >= HELD
    assert codes == {"RESOURCE_EXHAUSTED": STALLED - stalled}
    assert all("--max-bytes-per-token" in detail for detail in details)
    assert waited == STALLED - stalled
    records = _audited(audit, "RESOURCE_EXHAUSTED")
    assert records and all(record["what"] == "ReadBlocks" for record in records)


def _stream_config(tmp_path: Path, **limits: object) -> tuple[Path, ServerConfig]:
    data = _publish(tmp_path, files=2)
    config = ServerConfig(
        tokens=_tokens(tmp_path), insecure=True, audit_log=tmp_path / "audit.jsonl", **limits
    )
    return data, config


def test_a_token_over_its_stream_cap_is_refused_at_once(tmp_path: Path) -> None:
    data, config = _stream_config(tmp_path, max_streams_per_token=4)
    metrics = HubMetrics()
    with ServerThread(data, config=config, metrics=metrics) as server:
        address = f"127.0.0.1:{server.port}"
        with grpc.insecure_channel(address) as channel:
            stub = hub_pb2_grpc.HubStub(channel)
            (digest_a, _), *_ = _blocks(stub, "a", TOKEN_A)
            (digest_b, _), *_ = _blocks(stub, "b", TOKEN_B)

        async def streams() -> tuple[list[str], float, str, int]:
            async with grpc.aio.insecure_channel(address, options=STALL) as channel:
                stub = hub_pb2_grpc.HubStub(channel)
                request = hub_pb2.ReadBlocksRequest(digests=[digest_a])
                held = [
                    stub.ReadBlocks(iter([request]), metadata=bearer(TOKEN_A), timeout=30)
                    for _ in range(4)
                ]
                for call in held:  # each has sent its first chunk: the stream is served
                    await call.read()
                started = time.monotonic()
                fifth = stub.ReadBlocks(iter([request]), metadata=bearer(TOKEN_A), timeout=30)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await fifth.read()
                took = time.monotonic() - started
                got = await _read_whole(stub, digest_b, TOKEN_B)
                codes = [refused.value.code().name]
                for call in held:
                    call.cancel()
                return codes, took, refused.value.details() or "", got

        codes, took, details, got = asyncio.run(streams())
    assert codes == ["RESOURCE_EXHAUSTED"]
    assert took < 2  # refused, not queued
    name = f"token {hash_token(TOKEN_A)[:6].hex()}"  # its hash names it, not its line
    assert f"token {name} has 4 ReadBlocks streams open" in details
    assert "--max-streams-per-token 4" in details
    assert got == BLOCK  # the other token's stream is served meanwhile
    assert metrics.limit_refusals.labels(limit="streams")._value.get() == 1
    (record,) = _audited(tmp_path / "audit.jsonl", "RESOURCE_EXHAUSTED")
    assert record["what"] == "ReadBlocks"


def _holder() -> bytes:
    return Ed25519PrivateKey.generate().public_key().public_bytes_raw()


def test_issue_grant_is_limited_per_token_and_per_holder_key(tmp_path: Path) -> None:
    data, config = _stream_config(tmp_path, grant_holders_per_token=2, grant_lifetime_s=60)
    metrics = HubMetrics()
    holders = [_holder() for _ in range(3)]
    with (
        ServerThread(data, config=config, metrics=metrics) as server,
        grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        stub = hub_pb2_grpc.HubStub(channel)

        def issue(holder: bytes, token: str = TOKEN_A) -> grpc.StatusCode:
            try:
                stub.IssueGrant(
                    hub_pb2.IssueGrantRequest(holder_key=holder, node="127.0.0.1:7879"),
                    timeout=RPC_TIMEOUT,
                    metadata=bearer(token),
                )
            except grpc.RpcError as err:
                issue.details = err.details()  # type: ignore[attr-defined]
                return err.code()  # type: ignore[no-any-return]
            return grpc.StatusCode.OK

        # a spoke renews at half the lifetime: within one lifetime at most 3, and 4 pass
        renewals = [issue(holders[0]) for _ in range(4)]
        fifth = issue(holders[0])
        fifth_details = issue.details  # type: ignore[attr-defined]
        second = issue(holders[1])
        third = issue(holders[2])
        third_details = issue.details  # type: ignore[attr-defined]
        other_token = issue(holders[2], TOKEN_B)
        malformed = issue(b"\0" * 5)  # refused for what it is, and counts for nothing
    assert renewals == [grpc.StatusCode.OK] * 4
    assert fifth == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "issued 4 read grants within 60 s" in fifth_details
    assert second == grpc.StatusCode.OK
    assert third == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "live read grants for 2 holder keys" in third_details
    assert "--grant-holders-per-token 2" in third_details
    assert other_token == grpc.StatusCode.OK  # each token has its own
    assert malformed == grpc.StatusCode.INVALID_ARGUMENT
    assert metrics.limit_refusals.labels(limit="grants")._value.get() == 2
    records = _audited(tmp_path / "audit.jsonl", "RESOURCE_EXHAUSTED")
    assert [record["what"] for record in records] == ["IssueGrant", "IssueGrant"]


def test_manifest_and_watch_streams_are_bounded_per_token(tmp_path: Path) -> None:
    """The second probe's case: GetManifest and Watch streams a token opens and never reads.
    With 8 slots of each kind (one per token), a token's second manifest stream waits for
    --budget-wait and is refused, its second watch at once; the other token is served."""
    data, config = _stream_config(
        tmp_path, max_manifest_streams=8, max_watch_streams=8, budget_wait_s=0.5
    )
    # a manifest of a's bigger than a stalled client's 64 KiB window: its stream stays open
    names = {f"deep/{'x' * 150}/{i:05d}.bin": b"z" for i in range(2000)}
    publish(data, "a", write_tree(tmp_path / "src-a-many", names))
    metrics = HubMetrics()
    with ServerThread(data, config=config, metrics=metrics) as server:
        address = f"127.0.0.1:{server.port}"

        async def streams() -> tuple[list[str], list[str], int]:
            async with grpc.aio.insecure_channel(address, options=STALL) as channel:
                stub = hub_pb2_grpc.HubStub(channel)
                manifest = hub_pb2.GetManifestRequest(dataset="a", ref="latest")
                held = stub.GetManifest(manifest, metadata=bearer(TOKEN_A), timeout=30)
                await held.read()  # it holds its slot, unread
                codes, details = [], []
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.GetManifest(manifest, metadata=bearer(TOKEN_A), timeout=30).read()
                codes.append(refused.value.code().name)
                details.append(refused.value.details() or "")
                # two watches of one token: whichever asks second is refused, the other stays
                watches = [
                    stub.Watch(hub_pb2.WatchRequest(), metadata=bearer(TOKEN_A), timeout=30)
                    for _ in range(2)
                ]
                reads = [asyncio.ensure_future(w.read()) for w in watches]
                # the other may read an event (the publish above) first: wait for the refusal
                done, _ = await asyncio.wait(reads, timeout=20, return_when="FIRST_EXCEPTION")
                errors = [r.exception() for r in done if r.exception() is not None]
                assert len(errors) == 1
                error = errors[0]
                assert isinstance(error, grpc.aio.AioRpcError)
                codes.append(error.code().name)
                details.append(error.details() or "")
                other = hub_pb2.GetManifestRequest(dataset="b", ref="latest")
                entries = [e async for e in stub.GetManifest(other, metadata=bearer(TOKEN_B))]
                held.cancel()
                for w, r in zip(watches, reads, strict=True):
                    w.cancel()
                    r.cancel()
                return codes, details, len(entries)

        codes, details, served = asyncio.run(streams())
    assert codes == ["RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"]
    assert "GetManifest streams are open (1 for token" in details[0]
    assert "(--max-manifest-streams), 1 per token" in details[0]
    assert "(--max-watch-streams), 1 per token" in details[1]
    assert served > 0  # the other token's manifest is read meanwhile
    assert metrics.limit_refusals.labels(limit="streams")._value.get() == 2
    records = _audited(tmp_path / "audit.jsonl", "RESOURCE_EXHAUSTED")
    assert sorted(r["what"] for r in records) == ["GetManifest", "Watch"]


def test_unary_slots_are_given_back_when_each_call_is_done(tmp_path: Path) -> None:
    """A unary call holds a slot until gRPC reports it done (its reply may wait unread at
    the hub): more calls in turn than a token's share are all served, so each gave its slot
    back; what an unread reply holds is bounded by the slots (hub/limits/streams.py)."""
    data, config = _stream_config(tmp_path)
    with (
        ServerThread(data, config=config) as server,
        grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        stub = hub_pb2_grpc.HubStub(channel)
        share = UNARY_CALLS // TOKEN_SHARE
        for _ in range(share + 10):
            stub.ResolveRef(
                hub_pb2.ResolveRefRequest(dataset="a", ref="latest"),
                metadata=bearer(TOKEN_A),
                timeout=RPC_TIMEOUT,
            )
        listing = LISTING_CALLS // TOKEN_SHARE
        for _ in range(listing + 5):
            stub.ListDirectory(
                hub_pb2.ListDirectoryRequest(dataset="a", ref="latest"),
                metadata=bearer(TOKEN_A),
                timeout=RPC_TIMEOUT,
            )


def test_calls_that_never_finish_their_request_hold_a_bounded_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fourth probe's case: a token's clients start calls and never finish sending the
    request. Each holds one of its token's call slots from its headers on (a token an
    eighth of hub.serve.gate.CALLS); beyond, refused; each ends after inbound.REQUEST_WAIT_S;
    another
    token is served meanwhile."""
    monkeypatch.setattr(inbound, "REQUEST_WAIT_S", 2.0)
    data, config = _stream_config(tmp_path)
    share = gate.CALLS // TOKEN_SHARE
    with ServerThread(data, config=config) as server:
        address = f"127.0.0.1:{server.port}"

        async def calls() -> tuple[list[str], list[str], str]:
            # 3 connections: a connection carries at most 256 calls (hub.limits.sizes)
            channels = [grpc.aio.insecure_channel(address, options=OWN) for _ in range(3)]

            async def never() -> AsyncIterator[hub_pb2.ResolveRefRequest]:
                await asyncio.Event().wait()
                yield hub_pb2.ResolveRefRequest()  # pragma: no cover (never reached)

            try:
                pending = []
                for i in range(share + 8):
                    resolve = channels[i % 3].stream_unary(  # ResolveRef, request never sent
                        "/protocol.hub.v1.Hub/ResolveRef",
                        request_serializer=hub_pb2.ResolveRefRequest.SerializeToString,
                        response_deserializer=hub_pb2.Snapshot.FromString,
                    )
                    pending.append(resolve(never(), metadata=bearer(TOKEN_A), timeout=30))
                async with grpc.aio.insecure_channel(address, options=OWN) as other:
                    snapshot = await hub_pb2_grpc.HubStub(other).ResolveRef(
                        hub_pb2.ResolveRefRequest(dataset="b", ref="latest"),
                        metadata=bearer(TOKEN_B),
                        timeout=RPC_TIMEOUT,
                    )
                codes, details = [], []
                for call in pending:
                    with pytest.raises(grpc.aio.AioRpcError) as ended:
                        await call
                    codes.append(ended.value.code().name)
                    details.append(ended.value.details() or "")
                return codes, details, snapshot.dataset
            finally:
                for channel in channels:
                    await channel.close()

        codes, details, served = asyncio.run(calls())
    assert served == "b"
    assert codes == ["RESOURCE_EXHAUSTED"] * (share + 8)
    assert sum("no request message within 2 s" in d for d in details) == share
    assert sum(f"{share} per token" in d for d in details) == 8
