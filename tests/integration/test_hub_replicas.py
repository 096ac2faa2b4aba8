"""Hub replicas over one shared catalog (a real PostgreSQL server on 127.0.0.1).

Several ``strata-hub serve --catalog URL`` processes, each with its own data directory
and one blob store: any replica answers any call, a publish is seen by ``Watch`` on every
replica, racing publishes of one version name have one winner, sequence numbers stay
gap-free, a publisher killed mid-publish leaves nothing visible, ``migrate`` copies a
data directory's catalog exactly, and the engine's outage is answered ``UNAVAILABLE``
(health NOT_SERVING, ``/readyz`` 503) and healed without a restart.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from deploy.local import LocalStack, free_port
from hub.auth.grants import ensure_grant_key
from hub.catalog import Catalog
from hub.catalog.events import EventKind
from hub.errors import VersionExists
from hub.publish.tree import publish
from hub.serve.config import ServerConfig
from hub.serve.serverthread import ServerThread
from hub.store.datadir import DataDir
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc
from spoke.hublink.client import HubClient
from spoke.hublink.credentials import HubCredentials
from tests.conftest import REPO_ROOT
from tests.integration.hub_support import Pki, pki_fixture  # noqa: F401  (the pki fixture)
from tests.pgserver import PostgresServer
from tests.support import eventually

RPC_TIMEOUT = 10.0


def hub_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hub", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def resolve(address: str, dataset: str, ref: str) -> hub_pb2.Snapshot:
    with grpc.insecure_channel(address) as channel:
        return hub_pb2_grpc.HubStub(channel).ResolveRef(
            hub_pb2.ResolveRefRequest(dataset=dataset, ref=ref), timeout=RPC_TIMEOUT
        )


class Watcher(threading.Thread):
    """A Watch stream on one replica, recording (sequence, arrival time) of each event."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.channel = grpc.insecure_channel(address)
        self.events: list[tuple[int, float]] = []
        self.call = hub_pb2_grpc.HubStub(self.channel).Watch(hub_pb2.WatchRequest(after_sequence=0))
        self.start()

    def run(self) -> None:
        try:
            for event in self.call:
                self.events.append((event.sequence, time.monotonic()))
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self.call.cancel()
        self.channel.close()


@pytest.fixture
def shared(pg_url: str, tmp_path: Path) -> Iterator[tuple[LocalStack, str, Path]]:
    """A stack to start replicas in, the catalog URL and the shared blob store."""
    with LocalStack() as stack:
        yield stack, pg_url, tmp_path / "blobs"


def start_replicas(stack: LocalStack, url: str, root: Path, n: int) -> list[str]:
    return [stack.start_hub(root / f"replica{i}", extra=("--catalog", url)) for i in range(n)]


def test_any_replica_answers_and_watch_sees_a_publish_on_every_replica_within_2_s(
    shared: tuple[LocalStack, str, Path], tmp_path: Path
) -> None:
    stack, url, blobs = shared
    src = tree(tmp_path / "src", {"a.bin": os.urandom(300_000), "d/b.txt": b"b"})
    first = publish(tmp_path / "pub", "f3", src, catalog=url, blobs=str(blobs), block_size=65536)
    replicas = start_replicas(stack, url, tmp_path, 3)
    for address in replicas:
        assert resolve(address, "f3", "latest").snapshot_id == first.snapshot_id
    watchers = [Watcher(address) for address in replicas]
    try:
        eventually(
            lambda: all(len(w.events) == 2 for w in watchers), "the first 2 events", 10
        )  # v1, tag
        (src / "a.bin").write_bytes(os.urandom(1000))
        committed = time.monotonic()
        second = publish(tmp_path / "pub", "f3", src, catalog=url, block_size=65536)
        eventually(lambda: all(len(w.events) == 4 for w in watchers), "4 events on each", 10)
        for watcher in watchers:
            assert [s for s, _ in watcher.events] == [1, 2, 3, 4], "gap-free, in order"
            assert watcher.events[-1][1] - committed < 2.0, "within 2 s of the commit"
        for address in replicas:
            assert resolve(address, "f3", "latest").version == second.version == "v2"
    finally:
        for watcher in watchers:
            watcher.close()


def test_racing_publishes_and_tag_moves_lose_nothing_and_leave_no_gap(
    pg_url: str, tmp_path: Path
) -> None:
    """100 operations from 3 writers' data directories on one catalog: 40 publishes and 40
    tag moves all at once, then 10 rounds of two publishes of the same version name."""
    src = tree(tmp_path / "src", {"a": b"a"})
    publish(tmp_path / "w0", "f3", src, catalog=pg_url, blobs=str(tmp_path / "blobs"))

    def publish_one(index: int, version: str | None = None) -> str:
        member = tree(tmp_path / f"src{index}", {"a": f"{index}".encode()})
        try:
            publish(tmp_path / f"w{index % 3}", "f3", member, version=version, catalog=pg_url)
            return "won"
        except VersionExists as err:
            assert f"f3 {version} is already published" in str(err)
            return "lost"

    def move_tag(index: int) -> str:
        with Catalog(pg_url) as catalog:
            catalog.set_tag("f3", f"t{index}", "v1")
        return "moved"

    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(publish_one, i) for i in range(40)]
        futures += [pool.submit(move_tag, i) for i in range(40)]
        outcomes = [future.result() for future in futures]
        for round_ in range(10):
            pair = [
                pool.submit(publish_one, 100 + 2 * round_ + i, f"v{42 + round_}") for i in (0, 1)
            ]
            outcomes += [future.result() for future in pair]
    assert outcomes.count("won") == 50 and outcomes.count("lost") == 10
    assert outcomes.count("moved") == 40
    with Catalog(pg_url) as catalog:
        versions = [s.version for s in catalog.list_versions("f3")]
        assert versions == [f"v{n}" for n in range(1, 52)], "no lost version, no gap"
        events = catalog.events_after(0, 10_000)
        assert [e.sequence for e in events] == list(range(1, len(events) + 1)), "gap-free"
        published = [e.version for e in events if e.kind == EventKind.VERSION_PUBLISHED]
        assert sorted(published) == list(range(1, 52)), "one event per version"
        tags = {t.name: t.version for t in catalog.list_tags("f3")}
        assert {name: v for name, v in tags.items() if name != "latest"} == {
            f"t{i}": "v1" for i in range(40)
        }, "no lost tag move"
        moves = [e for e in events if e.kind == EventKind.TAG_MOVED and e.tag.startswith("t")]
        assert len(moves) == 40


def test_a_publisher_killed_mid_publish_leaves_nothing_visible_and_gc_is_safe(
    pg_url: str, tmp_path: Path
) -> None:
    blobs = tmp_path / "blobs"
    small = tree(tmp_path / "small", {"keep": os.urandom(5000)})
    publish(tmp_path / "pub", "f3", small, catalog=pg_url, blobs=str(blobs), block_size=4096)
    big = tree(tmp_path / "big", {f"d/f{i:04d}": os.urandom(20_000) for i in range(1500)})
    process = subprocess.Popen(
        [sys.executable, "-m", "hub", "publish", "--data-dir", str(tmp_path / "pub"),
         "--catalog", pg_url, "--block-size", "4096", "f3", str(big)],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    with Catalog(pg_url) as catalog:
        eventually(lambda: catalog.list_publishes() != [], "a publish staged", 60)
        eventually(  # well inside the walk (7,500 blocks): staged entries and stored blocks
            lambda: sum(1 for p in blobs.rglob("*") if p.is_file()) >= 500, "blocks stored", 60
        )
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        assert [s.version for s in catalog.list_versions("f3")] == ["v1"], "nothing visible"
        assert len(catalog.list_publishes()) == 1, "the dead publish is still recorded"
    done = hub_cli("gc", "--data-dir", str(tmp_path / "pub"), "--catalog", pg_url,
                   "--stale-after", "0")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "abandoned publishes 1" in done.stderr
    done = hub_cli("verify", "--data-dir", str(tmp_path / "pub"), "--catalog", pg_url,
                   "--blocks", "f3", "v1")  # fmt: skip
    assert done.returncode == 0, done.stderr
    again = publish(tmp_path / "pub", "f3", small, catalog=pg_url, tag="again")
    assert again.version == "v2", "the dead publish took no version number"


def test_migrate_copies_a_data_directory_catalog_exactly(
    pg_server: PostgresServer, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    src = tree(tmp_path / "src", {"a.bin": os.urandom(200_000), "d/e/b": b"b"})
    assert hub_cli("publish", "--data-dir", str(data), "f3", str(src)).returncode == 0
    (src / "a.bin").write_bytes(os.urandom(10))
    assert hub_cli("publish", "--data-dir", str(data), "f3", str(src)).returncode == 0
    assert hub_cli("tag", "--data-dir", str(data), "f3", "v1", "stable").returncode == 0
    url = pg_server.database()
    local = hub_cli("ls", "--data-dir", str(data), "f3").stdout
    # a replica started on the new database first records the same store: still accepted
    early = DataDir.open(tmp_path / "early", create=True, catalog=url)
    with early.open_catalog(create=True) as catalog:
        early.blob_store(catalog, str(data / "blobs"))
    done = hub_cli("migrate", "--data-dir", str(data), "--catalog", url)
    assert done.returncode == 0, done.stderr
    assert "both catalogs hold the same records" in done.stderr
    assert f"blobs: {data / 'blobs'}" in done.stderr, "the relative store became absolute"
    for moved in (("gc",), ("publish", "f3", str(src)), ("ls", "f3")):
        refused = hub_cli(moved[0], "--data-dir", str(data), *moved[1:])
        assert refused.returncode == 2, refused.stderr
        assert f"use --catalog {url}" in refused.stderr, "the old catalog is retired"
    copied = hub_cli("ls", "--data-dir", str(data), "--catalog", url, "f3")
    assert copied.returncode == 0 and copied.stdout == local
    for ref in ("v1", "stable", "latest"):
        done = hub_cli("verify", "--data-dir", str(data), "--catalog", url, "--blocks", "f3", ref)
        assert done.returncode == 0, done.stderr
    again = hub_cli("migrate", "--data-dir", str(data), "--catalog", url)
    assert again.returncode == 2
    assert "is not empty" in again.stderr and "Traceback" not in again.stderr
    elsewhere = hub_cli("migrate", "--data-dir", str(data), "--catalog", pg_server.database())
    assert elsewhere.returncode == 0, elsewhere.stderr
    bad = hub_cli("ls", "--data-dir", str(data), "--catalog", "mysql://x/y")
    assert bad.returncode == 2 and "must be a postgresql:// URL" in bad.stderr


def test_the_engine_down_is_unavailable_and_heals_by_itself(
    pg_server: PostgresServer, tmp_path: Path
) -> None:
    url = pg_server.database()
    src = tree(tmp_path / "src", {"a": b"a"})
    publish(tmp_path / "pub", "f3", src, catalog=url, blobs=str(tmp_path / "blobs"))
    metrics = free_port()
    with LocalStack() as stack:
        address = stack.start_hub(
            tmp_path / "replica", metrics=f"127.0.0.1:{metrics}", extra=("--catalog", url)
        )
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)

            def status() -> int:
                request = health_pb2.HealthCheckRequest(service="protocol.hub.v1.Hub")
                return int(health.Check(request, timeout=RPC_TIMEOUT).status)

            def ready() -> int:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/readyz") as r:
                        return int(r.status)
                except urllib.error.HTTPError as err:
                    return int(err.code)

            assert status() == health_pb2.HealthCheckResponse.SERVING and ready() == 200
            pg_server.stop()
            try:
                eventually(
                    lambda: status() == health_pb2.HealthCheckResponse.NOT_SERVING,
                    "NOT_SERVING",
                    15,
                )
                assert ready() == 503
                with pytest.raises(grpc.RpcError) as raised:
                    resolve(address, "f3", "latest")
                assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "catalog engine" in (raised.value.details() or "")
                done = hub_cli("publish", "--data-dir", str(tmp_path / "pub"),
                               "--catalog", url, "f3", str(src))  # fmt: skip
                assert done.returncode == 1, "a system failure (retry), not bad input"
                assert "unreachable" in done.stderr and "Traceback" not in done.stderr
                assert len(done.stderr.strip().splitlines()) == 1
            finally:
                pg_server.start()
            eventually(lambda: status() == health_pb2.HealthCheckResponse.SERVING, "SERVING", 15)
            assert ready() == 200
            assert resolve(address, "f3", "latest").version == "v1"


def test_a_spoke_client_with_two_tls_replicas_fails_over_when_one_stops(
    pg_url: str, tmp_path: Path, pki: Pki
) -> None:
    """``HubClient("A,B")`` over TLS: the certificate is checked against the first
    address (the channel's authority), calls spread over both, and go on when one stops."""
    src = tree(tmp_path / "src", {"a": b"a"})
    publish(tmp_path / "pub", "f3", src, catalog=pg_url, blobs=str(tmp_path / "blobs"))
    key = ensure_grant_key(tmp_path)  # one grant key for both replicas
    config = ServerConfig(
        tls_cert=pki.server.cert, tls_key=pki.server.key, catalog=pg_url, grant_key=key
    )
    first = ServerThread(tmp_path / "r0", config=config).start()
    second = ServerThread(tmp_path / "r1", config=config).start()
    try:

        async def resolve_through(client: HubClient, times: int) -> list[str]:
            return [(await client.resolve_ref("f3", "latest")).version for _ in range(times)]

        async def scenario() -> tuple[list[str], list[str]]:
            client = HubClient(
                f"127.0.0.1:{first.port},127.0.0.1:{second.port}",
                credentials=HubCredentials(ca=pki.ca.pem.cert),
            )
            try:
                before = await resolve_through(client, 4)
                await asyncio.to_thread(first.stop)
                after = await resolve_through(client, 4)
                return before, after
            finally:
                await client.close()

        before, after = asyncio.run(scenario())
        assert before == after == ["v1"] * 4
    finally:
        first.stop()
        second.stop()


def test_a_replica_with_another_grant_key_refuses_to_start(
    pg_url: str, tmp_path: Path, pki: Pki
) -> None:
    """The first replica records its grant key's id in the shared catalog; a replica with
    another key is refused (spokes would refuse some of its grants) until a rotation
    records the new key, after which the old one is refused in turn."""
    from hub.errors import Conflict

    src = tree(tmp_path / "src", {"a": b"a"})
    publish(tmp_path / "pub", "f3", src, catalog=pg_url, blobs=str(tmp_path / "blobs"))
    keys = []
    for name in ("key-a", "key-b"):
        (tmp_path / name).mkdir()
        keys.append(ensure_grant_key(tmp_path / name))

    def replica(name: str, key: Path, rotate: bool = False) -> ServerThread:
        config = ServerConfig(
            tls_cert=pki.server.cert,
            tls_key=pki.server.key,
            catalog=pg_url,
            grant_key=key,
            rotate_grant_key=rotate,
        )
        return ServerThread(tmp_path / name, config=config)

    with replica("r0", keys[0]):
        with pytest.raises(Conflict, match="sign read grants with key") as refused:
            replica("r1", keys[1]).start()
        assert "--rotate-grant-key" in str(refused.value)
        with replica("r2", keys[0]):  # the same key: starts
            pass
    with replica("r3", keys[1], rotate=True):  # a rotation records the new key
        pass
    with pytest.raises(Conflict, match="sign read grants with key"):
        replica("r4", keys[0]).start()


def test_catalog_mistakes_are_one_line_naming_the_cause(
    pg_server: PostgresServer, tmp_path: Path
) -> None:
    src = tree(tmp_path / "src", {"a": b"a"})
    data = tmp_path / "data"
    data.mkdir()
    fresh = pg_server.database()
    cases = [
        # a new shared catalog must be told where the blocks of every replica live
        (("publish", "--catalog", fresh, "f3", str(src)), 2, "records no blob store yet"),
        (("ls", "--catalog", pg_server.url("nosuchdb")), 2, 'database "nosuchdb" does not exist'),
        (("ls", "--catalog", f"postgresql://nobody@127.0.0.1:{pg_server.port}/x"), 2, "nobody"),
        (("ls", "--catalog", f"postgresql://postgres@127.0.0.1:{free_port()}/x"), 1, "unreachable"),
    ]
    for args, code, words in cases:
        done = hub_cli(args[0], "--data-dir", str(data), *args[1:])
        assert done.returncode == code, (args, done.stderr)
        assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
