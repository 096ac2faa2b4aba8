"""Opens of cached small files: the mount's CPU per open+release, and opens/s beside local disk.

    python -m bench.opens [--files 4000] [--threads 4] [--passes 3] [--workers 1,2,4]
                          [--json FILE]

``--files`` files of 64 KiB (one block each, Zarr-chunk sized) are published, read once
through a spoke's mount (``--passthrough auto``, so the cache holds them and the kernel
reads them from their block files), then each pass opens, reads whole and closes every
file, shuffled, in ``--threads`` threads, on local disk and through the mount, in the same
run. Two kinds of pass:

* ``cold names``: page cache, dentries and inodes dropped first (``drop_caches`` 3), as
  after a node's memory pressure: each file costs the mount a ``lookup``, an ``open`` and
  a ``release``;
* ``warm names``: page cache dropped (1) but the kernel's dentries kept: an ``open`` and a
  ``release`` (the file's bytes come from the block file either way).

The mount's CPU is the mount processes' own clocks (``utime + stime`` of
``/proc/PID/stat``, all threads, summed over the ``--mount-workers`` processes) over the
pass, divided by the opens; the daemon is not counted (cached opens never reach it).
``--workers 1,2,4`` runs both pass kinds once per worker count, one spoke after the
other on the same warm cache, so opens/s per worker count are side by side in one run.
Prints, per pass kind, the mount's µs of CPU per file (the issue's target: ≤ 50 µs per
open+release), opens/s local and mount, and mount/local (target ≥ 0.5). Needs root for
dropping caches (else the passes say so).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from deploy.local import LocalStack, drop_page_cache, publish
from spoke.run.supervisor import mount_processes

FILE_BYTES = 64 << 10
BLOCK_SIZE = 64 << 20  # every file is one block


def process_cpu_s(pid: int) -> float:
    """CPU seconds ``pid`` has used so far, all threads (utime + stime, /proc/PID/stat).

    Raises:
        OSError: no such process.
    """
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of proc(5))
    return ticks / os.sysconf("SC_CLK_TCK")


def open_read_close(paths: list[Path], threads: int) -> float:
    """Open, read whole and close every path, split over ``threads``; seconds taken.

    Raises:
        OSError: an open or read failed (a mount error is a failed benchmark).
    """
    chunks = [paths[i::threads] for i in range(threads)]
    errors: list[BaseException] = []

    def work(mine: list[Path]) -> None:
        try:
            for path in mine:
                fd = os.open(path, os.O_RDONLY)
                try:
                    while os.read(fd, 1 << 20):
                        pass
                finally:
                    os.close(fd)
        except BaseException as err:  # re-raised in the caller
            errors.append(err)

    workers = [threading.Thread(target=work, args=(c,)) for c in chunks]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    took = time.perf_counter() - start
    if errors:
        raise errors[0]
    return took


def make_source(root: Path, files: int) -> list[str]:
    """``files`` random files of :data:`FILE_BYTES` under ``root/d/``; their names."""
    (root / "d").mkdir(parents=True)
    names = [f"d/c{i:06d}" for i in range(files)]
    for name in names:
        (root / name).write_bytes(os.urandom(FILE_BYTES))
    return names


def measure(
    names: list[str], local: Path, mount: Path, pids: list[int], threads: int, passes: int
) -> list[dict[str, Any]]:
    """The two pass kinds (see the module doc), ``passes`` of each, best pass kept;
    ``pids``: the mount processes whose CPU is counted."""
    rows = []
    for kind, level in (("cold names", 3), ("warm names", 1)):
        best: dict[str, Any] | None = None
        for _ in range(passes):
            order = random.sample(names, len(names))
            dropped = drop_page_cache(level)
            local_s = open_read_close([local / n for n in order], threads)
            drop_page_cache(level)
            cpu0 = sum(map(process_cpu_s, pids))
            mount_s = open_read_close([mount / n for n in order], threads)
            cpu_us = (sum(map(process_cpu_s, pids)) - cpu0) * 1e6 / len(order)
            row: dict[str, Any] = {
                "pass": kind,
                "workers": len(pids),
                "files": len(order),
                "threads": threads,
                "dropped": dropped,
                "mount_cpu_us_per_open": cpu_us,
                "local_opens_s": len(order) / local_s,
                "mount_opens_s": len(order) / mount_s,
            }
            row["ratio"] = row["mount_opens_s"] / row["local_opens_s"]
            if best is None or row["mount_cpu_us_per_open"] < best["mount_cpu_us_per_open"]:
                best = row
        assert best is not None
        rows.append(best)
        print(
            f"{len(pids)} worker(s) {kind:>10}: "
            f"mount CPU {best['mount_cpu_us_per_open']:6.1f} µs/open+release  "
            f"opens/s local {best['local_opens_s']:8.0f}  mount {best['mount_opens_s']:8.0f}  "
            f"mount/local {best['ratio']:.2f}" + ("" if best["dropped"] else "  (not dropped)"),
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Entry point: prints one line per pass kind and a table; ``--json`` writes the rows."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.opens",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--passes", type=int, default=3, help="passes of each kind (best kept)")
    parser.add_argument(
        "--workers", default="1", help="comma-separated --mount-workers counts (default 1)"
    )
    parser.add_argument("--json", type=Path, default=None)
    ns = parser.parse_args(argv)
    try:
        counts = [int(c) for c in ns.workers.split(",")]
    except ValueError:
        parser.error(f"--workers {ns.workers}: comma-separated counts, e.g. 1,2,4")
    with tempfile.TemporaryDirectory(prefix="strata-opens-") as tmp:
        work = Path(tmp)
        names = make_source(work / "src", ns.files)
        publish(work / "hub", "op", work / "src", "--block-size", str(BLOCK_SIZE))
        cache_mib = ns.files * FILE_BYTES * 2 // (1 << 20) + 64
        with LocalStack() as stack:
            hub = stack.start_hub(work / "hub")
            cache, mnt = work / "cache", work / "mnt"
            rows = []
            for count in counts:
                extra = ("--passthrough", "auto", "--mount-workers", str(count))
                stack.start_spoke(hub, cache, mnt, f"{cache_mib}MiB", extra=extra)
                root = mnt / "op" / "v1"
                open_read_close([root / n for n in names], ns.threads)  # fill the cache
                state = os.getxattr(mnt, "user.strata.passthrough").decode()
                pids = _mount_pids(mnt, count)
                print(f"{len(pids)} mount worker(s); passthrough: {state}", flush=True)
                rows += measure(names, work / "src", root, pids, ns.threads, ns.passes)
                stack.stop_spoke()
    print(
        "\n| workers | pass | files | threads | mount CPU µs per open+release | local opens/s "
        "| mount opens/s | mount/local |\n|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r['workers']} | {r['pass']} | {r['files']} | {r['threads']} "
            f"| {r['mount_cpu_us_per_open']:.0f} "
            f"| {r['local_opens_s']:.0f} | {r['mount_opens_s']:.0f} | {r['ratio']:.2f} |"
        )
    if ns.json:
        ns.json.write_text(json.dumps({"passthrough": state, "rows": rows}, indent=2))
    return 0


def _mount_pids(mnt: Path, count: int, timeout: float = 30.0) -> list[int]:
    """The ``count`` mount processes serving ``mnt`` (workers start one after another).

    Raises:
        RuntimeError: fewer than ``count`` after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        pids = mount_processes(mnt.resolve())
        if len(pids) >= count:
            return pids
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(pids)} mount processes serve {mnt}, not {count}")
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
