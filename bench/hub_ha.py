"""Hub replicas over a shared catalog: ReadBlocks throughput with 1, 2 and 3 replicas,
hub CPU per GiB against the embedded-LMDB hub, and the longest read stall when a replica
is SIGKILLed under 4 readers.

    python -m bench.hub_ha [--size-mib 256] [--block-mib 1] [--clients 4] [--batch 16]
                           [--json FILE]

One run, side by side, on 127.0.0.1 (a PostgreSQL server of Debian's package is started
for it, :mod:`deploy.postgres`):

1. ``--size-mib`` of random bytes are published once into an LMDB data directory and
   once (the same blob store, so no block is stored twice) into the shared catalog.
2. Throughput rows: ``lmdb x1`` (today's hub), ``shared x1``, ``shared x2``, ``shared x3``.
   Each starts its replicas as ``strata-hub serve`` processes, then ``--clients`` client
   processes read every block once through ReadBlocks (``--batch`` digests per stream),
   each over one channel to every replica (``ipv4:A,B,C``, round-robin over healthy
   replicas: the spoke's channel). Printed: MB/s, each replica's CPU seconds per GiB it
   served (``/proc``, user + system), the hubs' total CPU per GiB, and PostgreSQL's. The
   target: the shared hub's CPU per GiB within 1.2x the LMDB hub's.
3. Failover: 3 replicas, 4 reader threads each reading its share one block per call in a
   loop, on one round-robin channel each; 2 s in, one replica is SIGKILLed, and the
   readers go on 4 s more. A failed call is retried after 0.1 s (the spoke fetcher's first
   backoff). Printed: reads that failed for good (target 0), calls retried, and the
   longest time any reader waited between two blocks (target <= 2 s).

On this 2-core machine the clients, the replicas and PostgreSQL share the cores, so
throughput does not grow with replicas here; CPU per GiB is the figure to compare.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path

from bench.measure import tree_cpu_seconds
from deploy.local import LocalStack
from deploy.postgres import PostgresServer

MiB = 1 << 20
GiB = 1 << 30
CPU_TARGET = 1.2
STALL_TARGET_S = 2.0


@dataclass(frozen=True)
class Row:
    """One throughput row."""

    name: str
    replicas: int
    mb_s: float
    hub_cpu_s_per_gib: float
    per_replica_cpu_s_per_gib: list[float]
    served_share: list[float]
    postgres_cpu_s_per_gib: float


@dataclass(frozen=True)
class Failover:
    """The failover run."""

    reads: int
    failed: int
    retried: int
    longest_stall_s: float


def _config(replicas: list[str]) -> tuple[str, list[tuple[str, object]]]:
    target = "ipv4:" + ",".join(replicas)
    service_config = json.dumps(
        {
            "loadBalancingConfig": [{"round_robin": {}}],
            "healthCheckConfig": {"serviceName": "protocol.hub.v1.Hub"},
        }
    )
    return target, [
        ("grpc.service_config", service_config),
        ("grpc.max_receive_message_length", 64 * MiB),
    ]


def client(replicas: list[str], digests: list[str], batch: int, barrier: Barrier) -> int:
    """Reads ``digests`` through ReadBlocks over one channel to every replica; bytes read."""
    import grpc

    from protocol.hub.v1 import hub_pb2, hub_pb2_grpc

    target, options = _config(replicas)
    with grpc.insecure_channel(target, options=options) as channel:
        stub = hub_pb2_grpc.HubStub(channel)
        for _ in replicas:  # a connection to each before the clock starts
            stub.ListDatasets(hub_pb2.ListDatasetsRequest(), timeout=30)
        time.sleep(1.0)  # and every replica's health check answered (round-robin uses it)
        barrier.wait()
        total = 0
        for start in range(0, len(digests), batch):
            request = hub_pb2.ReadBlocksRequest(digests=digests[start : start + batch])
            for chunk in stub.ReadBlocks(iter([request]), timeout=600):
                total += len(chunk.data)
        return total


def _served(metrics_url: str) -> float:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(httpx.get(metrics_url, timeout=10).text):
        for sample in family.samples:
            if sample.name == "strata_hub_blocks_served_bytes_total":
                return float(sample.value)
    return 0.0


def _start(
    stack: LocalStack, root: Path, n: int, catalog: str | None, data: Path | None
) -> list[tuple[str, subprocess.Popen[bytes], str]]:
    from deploy.local import free_port

    started = []
    for i in range(n):
        port = free_port()
        extra = ("--catalog", catalog) if catalog is not None else ()
        address = stack.start_hub(
            data if data is not None else root / f"replica{i}",
            metrics=f"127.0.0.1:{port}",
            extra=extra,
        )
        assert stack.hub is not None
        started.append((address, stack.hub, f"http://127.0.0.1:{port}/metrics"))
    return started


def throughput(
    name: str,
    root: Path,
    n: int,
    catalog: str | None,
    data: Path | None,
    digests: list[str],
    clients: int,
    batch: int,
    postgres: PostgresServer,
) -> Row:
    """One throughput row (see the module docstring)."""
    with LocalStack() as stack:
        replicas = _start(stack, root / name.replace(" ", "-"), n, catalog, data)
        addresses = [address for address, _, _ in replicas]
        context = multiprocessing.get_context("spawn")
        with context.Manager() as manager:
            barrier = manager.Barrier(clients + 1)
            with context.Pool(clients) as pool:
                results = [
                    pool.apply_async(client, (addresses, digests[i::clients], batch, barrier))
                    for i in range(clients)
                ]
                while barrier.n_waiting < clients:
                    time.sleep(0.01)
                cpu_before = [tree_cpu_seconds(p.pid) for _, p, _ in replicas]
                pg_before = tree_cpu_seconds(postgres.process.pid if postgres.process else None)
                served_before = [_served(m) for _, _, m in replicas]
                started = time.perf_counter()
                barrier.wait()
                total = sum(result.get(timeout=1800) for result in results)
                seconds = time.perf_counter() - started
                cpu = [
                    tree_cpu_seconds(p.pid) - b
                    for (_, p, _), b in zip(replicas, cpu_before, strict=True)
                ]
                pg_cpu = tree_cpu_seconds(postgres.process.pid if postgres.process else None)
                served = [
                    _served(m) - b for (_, _, m), b in zip(replicas, served_before, strict=True)
                ]
    gib = total / GiB
    return Row(
        name=name,
        replicas=n,
        mb_s=total / seconds / 1e6,
        hub_cpu_s_per_gib=sum(cpu) / gib,
        per_replica_cpu_s_per_gib=[
            c / (s / GiB) if s else 0.0 for c, s in zip(cpu, served, strict=True)
        ],
        served_share=[s / total for s in served],
        postgres_cpu_s_per_gib=(pg_cpu - pg_before) / gib if catalog is not None else 0.0,
    )


def failover(root: Path, catalog: str, digests: list[str], readers: int = 4) -> Failover:
    """The failover run (see the module docstring)."""
    import grpc

    from protocol.hub.v1 import hub_pb2, hub_pb2_grpc

    with LocalStack() as stack:
        replicas = _start(stack, root / "failover", 3, catalog, None)
        target, options = _config([address for address, _, _ in replicas])
        lock = threading.Lock()
        counts = {"reads": 0, "failed": 0, "retried": 0}
        stalls: list[float] = []

        stop = threading.Event()

        def reader(share: list[str]) -> None:
            with grpc.insecure_channel(target, options=options) as channel:
                stub = hub_pb2_grpc.HubStub(channel)
                last = time.monotonic()
                longest = 0.0
                index = 0
                while not stop.is_set():
                    digest = share[index % len(share)]
                    index += 1
                    for _attempt in range(20):
                        try:
                            request = hub_pb2.ReadBlocksRequest(digests=[digest])
                            size = sum(
                                len(c.data) for c in stub.ReadBlocks(iter([request]), timeout=10)
                            )
                            assert size > 0
                            break
                        except grpc.RpcError:
                            with lock:
                                counts["retried"] += 1
                            time.sleep(0.1)
                    else:
                        with lock:
                            counts["failed"] += 1
                    now = time.monotonic()
                    longest, last = max(longest, now - last), now
                    with lock:
                        counts["reads"] += 1
                with lock:
                    stalls.append(longest)

        threads = [
            threading.Thread(target=reader, args=(digests[i::readers],)) for i in range(readers)
        ]
        for thread in threads:
            thread.start()
        time.sleep(2.0)
        replicas[0][1].send_signal(signal.SIGKILL)
        time.sleep(4.0)
        stop.set()
        for thread in threads:
            thread.join()
    return Failover(counts["reads"], counts["failed"], counts["retried"], max(stalls))


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark and prints its table; exit 1 when a target is missed."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.hub_ha", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--block-mib", type=int, default=1)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from hub.catalog import Catalog
    from hub.publish.tree import publish

    root = Path(tempfile.mkdtemp(prefix="strata-hub-ha-"))
    postgres = PostgresServer(Path(tempfile.mkdtemp(prefix="strata-pg-")))
    try:
        src = root / "src"
        src.mkdir()
        block = args.block_mib * MiB
        for i in range(max(1, args.size_mib // 8)):
            (src / f"f{i:04d}.bin").write_bytes(os.urandom(8 * MiB))
        lmdb_data = root / "lmdb"
        publish(lmdb_data, "ds", src, block_size=block)
        url = postgres.database()
        publish(
            root / "pub", "ds", src, block_size=block, catalog=url, blobs=str(lmdb_data / "blobs")
        )
        with Catalog(url) as catalog:
            snapshot = catalog.resolve("ds", "latest")
            digests = [
                ref.digest
                for entry in catalog.iter_manifest(snapshot.snapshot_id)
                for ref in entry.blocks
            ]
        rows = [
            throughput(
                "lmdb x1", root, 1, None, lmdb_data, digests, args.clients, args.batch, postgres
            )
        ]
        for n in (1, 2, 3):
            rows.append(
                throughput(
                    f"shared x{n}", root, n, url, None, digests, args.clients, args.batch, postgres
                )
            )
        over = failover(root, url, digests)
    finally:
        postgres.close()
        subprocess.run(["rm", "-rf", str(root)], check=False)
    size = len(digests) * block
    print(
        f"hub replicas: {size / MiB:.0f} MiB in {args.block_mib} MiB blocks, {args.clients} clients"
    )
    print(
        f"{'row':<11} {'MB/s':>7} {'hub CPU s/GiB':>14} {'per replica s/GiB':>22} "
        f"{'share':>17} {'pg s/GiB':>9}"
    )
    for row in rows:
        per = " ".join(f"{c:.2f}" for c in row.per_replica_cpu_s_per_gib)
        share = " ".join(f"{s:.2f}" for s in row.served_share)
        print(
            f"{row.name:<11} {row.mb_s:>7.0f} {row.hub_cpu_s_per_gib:>14.2f} {per:>22} "
            f"{share:>17} {row.postgres_cpu_s_per_gib:>9.2f}"
        )
    ratio = rows[1].hub_cpu_s_per_gib / rows[0].hub_cpu_s_per_gib
    cpu_met = ratio <= CPU_TARGET
    print(
        f"shared x1 / lmdb x1 hub CPU per GiB: {ratio:.2f}x "
        f"(target <= {CPU_TARGET}x: {'met' if cpu_met else 'MISSED'})"
    )
    stall_met = over.failed == 0 and over.longest_stall_s <= STALL_TARGET_S
    print(
        f"failover (3 replicas, 1 SIGKILLed under 4 readers): {over.reads} reads, "
        f"{over.failed} failed, {over.retried} retried, longest stall {over.longest_stall_s:.2f} s "
        f"(target 0 failed, <= {STALL_TARGET_S} s: {'met' if stall_met else 'MISSED'})"
    )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"rows": [asdict(r) for r in rows], "failover": asdict(over), "cpu_ratio": ratio},
                indent=2,
            )
        )
    return 0 if cpu_met and stall_met else 1


if __name__ == "__main__":
    sys.exit(main())
