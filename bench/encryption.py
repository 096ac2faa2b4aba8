"""Warm-read cost of encryption at rest: the same files through two spokes, side by side.

    python -m bench.encryption [--quick] [--seq-mib 64] [--small-files 2000] [--json FILE]

One hub, two spokes started in the same run over the same published tree: one stores
block files as they are, the other with ``--encryption-key-file`` (AES-256-GCM, see
``spoke/disk/encryption.py``). Both caches are filled first (every file read once), then each
fio job of :mod:`bench.mount_io` (sequential 1 MiB, random 4 KiB and 1 MiB, small files)
runs on the plain mount and on the encrypted one, the kernel page cache dropped before
each run, so reads come from the spokes' disks and the encrypted mount decrypts every
32 KiB segment it serves. Prints MB/s and the ratio encrypted/plain per job. Needs
``fio`` and root (to drop the page cache).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.mount_io import jobs, make_source, run_fio
from deploy.local import LocalStack, drop_page_cache, publish
from spoke.disk.encryption import write_key


def _fill(mounted: Path) -> None:
    """Read every file once (the cache holds all of it afterwards)."""
    subprocess.run(
        ["cat", *map(str, sorted(mounted.rglob("*.*")))], stdout=subprocess.DEVNULL, check=True
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point: prints the table; ``--json`` also writes the figures."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.encryption",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--seq-mib", type=int, default=64, help="MiB per sequential file (8)")
    parser.add_argument("--small-files", type=int, default=2000)
    parser.add_argument("--runtime", type=int, default=5, help="seconds per random job")
    parser.add_argument("--json", type=Path, default=None)
    ns = parser.parse_args(argv)
    if shutil.which("fio") is None:
        sys.stderr.write("bench.encryption: error: fio is not installed (apt-get install fio)\n")
        return 2
    seq_mib, small, runtime = (8, 400, 2) if ns.quick else (ns.seq_mib, ns.small_files, ns.runtime)
    chosen = [j for j in jobs(seq_mib, small, runtime) if "x" not in j.name.split()[-1]]
    rows: list[dict[str, Any]] = []
    dropped = False
    with tempfile.TemporaryDirectory(prefix="strata-encryption-") as tmp:
        work = Path(tmp)
        make_source(work / "src", seq_mib, small)
        publish(work / "hub", "io", work / "src")
        key = work / "cache.key"
        write_key(key)
        cache_mib = 2 * (8 * seq_mib + small // 16) + 64
        with LocalStack() as stack:
            hub = stack.start_hub(work / "hub")
            roots = {}
            spokes = (("plain", ()), ("encrypted", ("--encryption-key-file", str(key))))
            for name, extra in spokes:
                cache, mnt = work / f"cache-{name}", work / f"mnt-{name}"
                stack.start_spoke(hub, cache, mnt, f"{cache_mib}MiB", extra=extra)
                roots[name] = work / f"mnt-{name}" / "io" / "v1"
                _fill(roots[name])
            for job in chosen:
                figures = {}
                for name, root in roots.items():
                    dropped = drop_page_cache(3)
                    figures[name] = run_fio(job, root)
                plain, sealed = figures["plain"], figures["encrypted"]
                row = {
                    "job": job.name,
                    "plain_mb_s": plain,
                    "encrypted_mb_s": sealed,
                    "ratio": sealed / plain if plain else 0.0,
                }
                rows.append(row)
                print(
                    f"{job.name:>16}: plain {plain:8.0f}  encrypted {sealed:8.0f} MB/s  "
                    f"encrypted/plain {row['ratio']:.2f}",
                    flush=True,
                )
    print("\n| fio job | plain mount MB/s | encrypted mount MB/s | encrypted/plain |")
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['job']} | {float(r['plain_mb_s']):.0f} | {float(r['encrypted_mb_s']):.0f} "
            f"| {float(r['ratio']):.2f} |"
        )
    if not dropped:
        print("(page cache NOT dropped: not root; these are page-cache reads)")
    if ns.json:
        ns.json.write_text(json.dumps({"page_cache_dropped": dropped, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
