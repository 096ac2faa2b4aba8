"""Opens of cached small files: the mount's CPU per open+release, and opens/s beside local disk.

    python -m bench.opens [--files 4000] [--threads 4] [--passes 3] [--json FILE]

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

The mount's CPU is the mount process's own clock (``utime + stime`` of
``/proc/PID/stat``, all its threads) over the pass, divided by the opens; the daemon is
not counted (cached opens never reach it). Prints, per pass kind, the mount's µs of CPU per
file (the issue's target: ≤ 50 µs per open+release), opens/s local and mount, and
mount/local (target ≥ 0.5). Needs root for dropping caches (else the passes say so).
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
from spoke.disk.layout import CacheLayout

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
    names: list[str], local: Path, mount: Path, pid: int, threads: int, passes: int
) -> list[dict[str, Any]]:
    """The two pass kinds (see the module doc), ``passes`` of each, best pass kept."""
    rows = []
    for kind, level in (("cold names", 3), ("warm names", 1)):
        best: dict[str, Any] | None = None
        for _ in range(passes):
            order = random.sample(names, len(names))
            dropped = drop_page_cache(level)
            local_s = open_read_close([local / n for n in order], threads)
            drop_page_cache(level)
            cpu0 = process_cpu_s(pid)
            mount_s = open_read_close([mount / n for n in order], threads)
            cpu_us = (process_cpu_s(pid) - cpu0) * 1e6 / len(order)
            row = {
                "pass": kind,
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
            f"{kind:>10}: mount CPU {best['mount_cpu_us_per_open']:6.1f} µs/open+release  "
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
    parser.add_argument("--json", type=Path, default=None)
    ns = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="strata-opens-") as tmp:
        work = Path(tmp)
        names = make_source(work / "src", ns.files)
        publish(work / "hub", "op", work / "src", "--block-size", str(BLOCK_SIZE))
        cache_mib = ns.files * FILE_BYTES * 2 // (1 << 20) + 64
        with LocalStack() as stack:
            hub = stack.start_hub(work / "hub")
            cache, mnt = work / "cache", work / "mnt"
            stack.start_spoke(hub, cache, mnt, f"{cache_mib}MiB", extra=("--passthrough", "auto"))
            root = mnt / "op" / "v1"
            open_read_close([root / n for n in names], ns.threads)  # fill the cache
            state = os.getxattr(mnt, "user.strata.passthrough").decode()
            print(f"passthrough: {state}", flush=True)
            pid = int(CacheLayout(cache).mount_pid_file.read_text())
            rows = measure(names, work / "src", root, pid, ns.threads, ns.passes)
    print(
        "\n| pass | files | threads | mount CPU µs per open+release | local opens/s "
        "| mount opens/s | mount/local |\n|---|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r['pass']} | {r['files']} | {r['threads']} | {r['mount_cpu_us_per_open']:.0f} "
            f"| {r['local_opens_s']:.0f} | {r['mount_opens_s']:.0f} | {r['ratio']:.2f} |"
        )
    if ns.json:
        ns.json.write_text(json.dumps({"passthrough": state, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
