"""Hub ReadBlocks throughput on loopback against reading the same blob files from disk.

    python -m bench.hub_throughput [--size-mib 256] [--block-mib 4] [--clients 1,4,16]
                                   [--batch 16] [--rounds 2] [--cache cold,warm] [--json FILE]

Publishes ``--size-mib`` of random bytes (``--block-mib`` blocks) into a fresh data dir,
starts ``strata-hub serve`` as its own process on 127.0.0.1, and for each client count
runs, side by side in one run:

- **hub**: N client processes share the blocks (worker i reads blocks i, i + N, ...),
  each reading its share through ReadBlocks (``--batch`` digests per stream, as the
  spoke's fetcher asks);
- **disk**: N processes share the blob files the same way, each reading its share from
  the hub's blob store (``open`` + ``read`` of the whole file).

Every byte is read once per run on each side.

Two page-cache states, each side measured under the same one:

- ``cold``: the kernel page cache is dropped before every timed run (root only), so both
  sides read the blob files from the device — the hub's cost over the disk it serves;
- ``warm``: the blob files are in the page cache for both sides, so "disk" is a memory
  copy — the strictest comparison, which measures gRPC's and Python's own cost.

Throughput is total bytes over the wall time from the moment all workers are released
to the last one done. Prints MB/s and the ratio hub / disk per client count and cache
state (target, docs/design.md: ≥ 0.5 with 4 clients).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from deploy.local import drop_page_cache

MiB = 1024 * 1024


def _share(items: list[str], worker: int, workers: int) -> list[str]:
    """Worker ``worker``'s share of ``items``: every ``workers``-th item from its index."""
    return items[worker::workers]


def hub_worker(target: str, digests: list[str], batch: int, barrier: Barrier) -> tuple[int, float]:
    """Reads every block once through ReadBlocks; returns (bytes, seconds after release)."""
    import grpc

    from protocol.hub.v1 import hub_pb2, hub_pb2_grpc

    options = [("grpc.max_receive_message_length", 64 * MiB)]
    with grpc.insecure_channel(target, options=options) as channel:
        stub = hub_pb2_grpc.HubStub(channel)
        stub.ListDatasets(hub_pb2.ListDatasetsRequest(), timeout=30)  # connect first
        barrier.wait()
        started = time.perf_counter()
        total = 0
        for start in range(0, len(digests), batch):
            request = hub_pb2.ReadBlocksRequest(digests=digests[start : start + batch])
            for chunk in stub.ReadBlocks(iter([request]), timeout=600):
                total += len(chunk.data)
        return total, time.perf_counter() - started


def disk_worker(paths: list[str], _batch: int, barrier: Barrier) -> tuple[int, float]:
    """Reads every blob file once; returns (bytes, seconds after release)."""
    barrier.wait()
    started = time.perf_counter()
    total = 0
    for path in paths:
        with open(path, "rb") as stream:
            total += len(stream.read())
    return total, time.perf_counter() - started


def _run(
    worker: Callable[..., tuple[int, float]],
    first_arg: Callable[[int], Any],
    workers: int,
    batch: int,
    cold: bool,
) -> float:
    """Runs ``workers`` processes released together; returns MB/s over the slowest."""
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        barrier = manager.Barrier(workers + 1)
        with context.Pool(workers) as pool:
            results = [
                pool.apply_async(worker, (*first_arg(i), batch, barrier)) for i in range(workers)
            ]
            while barrier.n_waiting < workers:  # every worker ready (hub: connected)
                time.sleep(0.01)
            if cold:
                drop_page_cache()
            barrier.wait()
            outcomes = [result.get(timeout=1800) for result in results]
    total = sum(nbytes for nbytes, _ in outcomes)
    seconds = max(elapsed for _, elapsed in outcomes)
    return total / seconds / 1e6


def _start_hub(data: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "hub", "serve", "--data-dir", str(data), "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.search(r"on (127\.0\.0\.1:\d+)$", line.strip())
    if match is None:
        process.kill()
        raise SystemExit(f"hub did not start: {line!r}")
    return process, match[1]


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m bench.hub_throughput", description=__doc__)
    parser.add_argument("--size-mib", type=int, default=256, help="dataset size, MiB")
    parser.add_argument("--block-mib", type=int, default=4, help="block size, MiB")
    parser.add_argument("--clients", default="1,4,16", help="client counts, comma-separated")
    parser.add_argument("--batch", type=int, default=16, help="digests per ReadBlocks stream")
    parser.add_argument("--rounds", type=int, default=2, help="repeats; the best is reported")
    parser.add_argument(
        "--cache",
        default="cold,warm",
        help="page-cache states to measure: cold (root only), warm, or both",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    states = [state for state in args.cache.split(",") if state in ("cold", "warm")]
    if "cold" in states and not drop_page_cache():
        print("cannot drop the page cache (not root): measuring warm only", file=sys.stderr)
        states = ["warm"]

    from hub.catalog import Catalog
    from hub.publish.tree import publish

    with tempfile.TemporaryDirectory(prefix="strata-bench-") as tmp:
        src, data = Path(tmp) / "src", Path(tmp) / "data"
        src.mkdir()
        block = args.block_mib * MiB
        for i in range(max(1, args.size_mib // args.block_mib)):
            (src / f"part-{i:05d}.bin").write_bytes(os.urandom(block))
        publish(data, "bench", src, block_size=block)
        with Catalog(data / "catalog") as catalog:
            snapshot = catalog.resolve("bench", "latest")
            digests = [
                ref.digest
                for entry in catalog.iter_manifest(snapshot.snapshot_id)
                for ref in entry.blocks
            ]
        paths = [str(data / "blobs" / d[:2] / d) for d in digests]
        for path in paths:  # warm the page cache for both sides
            Path(path).read_bytes()
        hub, target = _start_hub(data)
        rows = []
        try:
            for state in states:
                cold = state == "cold"
                for n in clients:
                    hub_rates, disk_rates = [], []
                    for _ in range(args.rounds):
                        disk_rates.append(
                            _run(
                                disk_worker,
                                lambda i, n=n: (_share(paths, i, n),),
                                n,
                                args.batch,
                                cold,
                            )
                        )
                        hub_rates.append(
                            _run(
                                hub_worker,
                                lambda i, n=n: (target, _share(digests, i, n)),
                                n,
                                args.batch,
                                cold,
                            )
                        )
                    rows.append(
                        {
                            "cache": state,
                            "clients": n,
                            "hub_mb_s": max(hub_rates),
                            "disk_mb_s": max(disk_rates),
                            "ratio": max(hub_rates) / max(disk_rates),
                        }
                    )
        finally:
            hub.terminate()
            hub.wait(timeout=30)
    print(
        f"hub ReadBlocks vs disk, {args.size_mib} MiB in {args.block_mib} MiB blocks, "
        f"batch {args.batch}, best of {args.rounds}, {os.cpu_count()} CPUs"
    )
    print(f"{'cache':>5}  {'clients':>7}  {'hub MB/s':>9}  {'disk MB/s':>9}  {'hub/disk':>8}")
    for row in rows:
        print(
            f"{row['cache']:>5}  {row['clients']:>7}  {row['hub_mb_s']:>9.0f}  "
            f"{row['disk_mb_s']:>9.0f}  {row['ratio']:>8.2f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"results": rows, "args": vars(args)}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
