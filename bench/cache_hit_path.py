"""Cache-hit read path: a warm spoke mount against the same bytes on local disk, one run.

    python -m bench.cache_hit_path [--size-mib 512] [--files 8] [--read-kib 1024] [--repeat 3]

Publishes ``--files`` random files to a local hub, starts a spoke and mount, reads every
file once through the mount (so every block is cached), then times sequential reads of the
same bytes from the local source files and through the mount, alternating, each after
dropping the kernel page cache (root only; otherwise the figures are page-cache reads and
say so). Prints MB/s and the ratio mount / local (target ≥ 0.75, docs/design.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from deploy.local import LocalStack, drop_page_cache, publish


def read_all(paths: list[Path], chunk: int) -> int:
    """Read every file sequentially in ``chunk``-byte reads; returns bytes read."""
    total = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            while data := os.read(fd, chunk):
                total += len(data)
        finally:
            os.close(fd)
    return total


def timed_read(paths: list[Path], chunk: int) -> float:
    """MB/s of :func:`read_all` after dropping the page cache."""
    drop_page_cache()
    started = time.perf_counter()
    n = read_all(paths, chunk)
    return n / (time.perf_counter() - started) / 1e6


def main(argv: list[str] | None = None) -> int:
    """Entry point: prints a table and the ratio; ``--json`` also writes the figures."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.cache_hit_path",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--size-mib", type=int, default=512, help="total bytes of the files")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--read-kib", type=int, default=1024, help="bytes per read() call")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--read-ahead-kb",
        type=int,
        default=1024,
        help="the mount's kernel readahead window (strata-spoke run's flag)",
    )
    parser.add_argument("--json", type=Path, default=None)
    ns = parser.parse_args(argv)
    chunk = ns.read_kib * 1024
    with tempfile.TemporaryDirectory(prefix="strata-bench-") as tmp:
        work = Path(tmp)
        src = work / "src"
        src.mkdir()
        per_file = ns.size_mib * 1024 * 1024 // ns.files
        for i in range(ns.files):
            (src / f"part-{i:03d}.bin").write_bytes(os.urandom(per_file))
        publish(work / "hub", "bench", src)
        with LocalStack() as stack:
            hub = stack.start_hub(work / "hub")
            stack.start_spoke(
                hub,
                work / "cache",
                work / "mnt",
                f"{2 * ns.size_mib}MiB",
                extra=("--read-ahead-kb", str(ns.read_ahead_kb)),
            )
            mounted = sorted((work / "mnt" / "bench" / "v1").iterdir())
            local = sorted(src.iterdir())
            read_all(mounted, chunk)  # warm the spoke cache: every block now on its disk
            dropped = drop_page_cache()
            local_mbs, mount_mbs = [], []
            for _ in range(ns.repeat):  # alternate so drift hits both sides alike
                local_mbs.append(timed_read(local, chunk))
                mount_mbs.append(timed_read(mounted, chunk))
    result = {
        "bytes": per_file * ns.files,
        "read_bytes": chunk,
        "page_cache_dropped": dropped,
        "local_mb_s": statistics.median(local_mbs),
        "mount_mb_s": statistics.median(mount_mbs),
    }
    result["ratio"] = result["mount_mb_s"] / result["local_mb_s"]
    note = "" if dropped else " (page cache NOT dropped: not root)"
    print(f"| path | MB/s (median of {ns.repeat}) |\n|---|---|")
    print(f"| local disk | {result['local_mb_s']:.0f} |")
    print(f"| warm Strata mount | {result['mount_mb_s']:.0f} |")
    print(f"ratio mount/local: {result['ratio']:.2f}{note}")
    if ns.json:
        ns.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
