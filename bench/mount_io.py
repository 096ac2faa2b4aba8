"""Mount I/O: fio on local disk, Python FUSE's floor and a warm Strata mount of the same files.

    python -m bench.mount_io [--quick] [--seq-mib 64] [--small-files 10000] [--json FILE]

Jobs (each after ``sync`` and dropping the kernel page cache, so the mount's numbers are
first reads from the spoke's disk, as docs/design.md's targets say):

* ``seq 1M``: sequential 1 MiB reads, 4 jobs, one file each;
* ``rand 4k`` / ``rand 1M``: random reads over the same files, 4 jobs, one pass (each
  block once) of at most ``--runtime`` seconds;
* ``small files``: 10,000 files of 64 KiB (zarr-chunk sized), read whole, 4 jobs;
* ``seq 1M xN``: parallel-reader scaling, N = 1, 2, 4, 8 jobs.

Four rows per job, measured in the same run: local disk, the **floor** — a minimal
pyfuse3 passthrough file system over the same source files (:mod:`bench.floorfs`: what any
Python FUSE file system can reach here) — the warm Strata mount with ``--passthrough off``
(every read through pyfuse3), and a second warm Strata mount with FUSE passthrough
(``--passthrough auto``: the kernel reads cached one-block files itself; the row says
``n/a`` where the kernel or library cannot). Both Strata mounts serve one dataset published
with 64 MiB blocks (the hub's largest), so every file of up to 64 MiB is one block.
Prints bandwidth (MB/s) and the ratios mount/local (targets: sequential ≥ 0.75, small
files ≥ 0.5), mount/floor (target: every job ≥ 0.8) and passthrough/local (targets:
sequential and random 1 MiB ≥ 0.9, random 4 KiB ≥ 0.5). Needs ``fio`` (Debian package)
and root for dropping the page cache.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.floorfs import FloorMount
from deploy.local import LocalStack, drop_page_cache, publish

JOBS = 4
BLOCK_SIZE = 64 << 20  # the hub's largest block: files up to this size are one block


@dataclass(frozen=True)
class Job:
    """One fio job line: name, fio arguments, and the directory (under the root) it reads."""

    name: str
    args: tuple[str, ...]
    subdir: str


def make_source(root: Path, seq_mib: int, small_files: int) -> None:
    """Files named as fio expects (``jobname.jobnum.filenum``) so fio reads, never lays out."""
    (root / "seq").mkdir(parents=True)
    for j in range(8):  # enough for the scaling jobs (up to 8 readers)
        with open(root / "seq" / f"seq.{j}.0", "wb") as f:
            for _ in range(seq_mib):
                f.write(os.urandom(1 << 20))
    (root / "small").mkdir()
    per_job = small_files // JOBS
    for j in range(JOBS):
        for i in range(per_job):
            (root / "small" / f"small.{j}.{i}").write_bytes(os.urandom(64 * 1024))


def jobs(seq_mib: int, small_files: int, runtime: int) -> list[Job]:
    """The fio jobs of one comparison."""
    seq = ("--name=seq", f"--size={seq_mib}M", "--bs=1M", "--rw=read")
    # one pass over the files (fio's random map reads each block once), at most `runtime`
    # seconds: a second pass would be served by the page cache, which fio's per-loop
    # invalidation drops for local files but cannot reach for a passthrough backing file
    timed = (f"--runtime={runtime}", "--name=seq", f"--size={seq_mib}M")
    out = [
        Job("seq 1M", (*seq, f"--numjobs={JOBS}"), "seq"),
        Job("rand 4k", (*timed, "--bs=4k", "--rw=randread", f"--numjobs={JOBS}"), "seq"),
        Job("rand 1M", (*timed, "--bs=1M", "--rw=randread", f"--numjobs={JOBS}"), "seq"),
        Job(
            "small files 64k",
            (
                "--name=small",
                f"--nrfiles={small_files // JOBS}",
                "--filesize=64k",
                "--bs=64k",
                "--rw=read",
                "--file_service_type=sequential",
                f"--numjobs={JOBS}",
            ),
            "small",
        ),
    ]
    out += [Job(f"seq 1M x{n}", (*seq, f"--numjobs={n}"), "seq") for n in (1, 2, 4, 8)]
    return out


def run_fio(job: Job, root: Path) -> float:
    """Aggregate read bandwidth of ``job`` over files under ``root``, MB/s."""
    proc = subprocess.run(
        [
            "fio",
            "--readonly",
            "--ioengine=psync",
            "--group_reporting",
            "--output-format=json",
            f"--directory={root / job.subdir}",
            *job.args,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(proc.stdout[proc.stdout.index("{") :])
    return float(sum(j["read"]["bw_bytes"] for j in report["jobs"])) / 1e6


def _compare(job: Job, roots: dict[str, Path | None]) -> dict[str, Any]:
    """One job on local disk, the floor, the mount and the passthrough mount (None: not
    measured), page cache dropped before each."""
    figures: dict[str, float | None] = {}
    for name, root in roots.items():
        if root is not None:
            drop_page_cache(3)
        figures[name] = run_fio(job, root) if root is not None else None
    local, floor, mount = (float(figures[k] or 0.0) for k in ("local", "floor", "mount"))
    passthrough = figures.get("passthrough")
    row: dict[str, Any] = {
        "job": job.name,
        "local_mb_s": local,
        "floor_mb_s": floor,
        "mount_mb_s": mount,
        "passthrough_mb_s": passthrough,
        "ratio": mount / local if local else 0.0,
        "floor_ratio": mount / floor if floor else 0.0,
        "passthrough_ratio": passthrough / local if passthrough is not None and local else None,
    }
    pt = "n/a" if passthrough is None else f"{passthrough:8.0f}"
    pt_ratio = "n/a" if row["passthrough_ratio"] is None else f"{row['passthrough_ratio']:.2f}"
    print(
        f"{job.name:>16}: local {local:8.0f}  floor {floor:8.0f}  mount {mount:8.0f}  "
        f"passthrough {pt} MB/s  mount/local {row['ratio']:.2f}  "
        f"mount/floor {row['floor_ratio']:.2f}  passthrough/local {pt_ratio}",
        flush=True,
    )
    return row


def _passthrough_opens(mnt: Path) -> tuple[str, int]:
    """The mount's passthrough state and how many opens went passthrough so far."""
    state = os.getxattr(mnt, "user.strata.passthrough").decode()
    return state, int(os.getxattr(mnt, "user.strata.passthrough_opens"))


def main(argv: list[str] | None = None) -> int:
    """Entry point: prints the table; ``--json`` also writes the figures."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.mount_io",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument(
        "--seq-mib", type=int, default=64, help="MiB per sequential file (≤ 64: one block)"
    )
    parser.add_argument("--small-files", type=int, default=10_000)
    parser.add_argument("--runtime", type=int, default=8, help="seconds per random job")
    parser.add_argument("--json", type=Path, default=None)
    ns = parser.parse_args(argv)
    if shutil.which("fio") is None:
        print("bench.mount_io: error: fio is not installed (apt-get install fio)", file=sys.stderr)
        return 2
    seq_mib, small, runtime = (8, 400, 2) if ns.quick else (ns.seq_mib, ns.small_files, ns.runtime)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="strata-mount-io-") as tmp:
        work = Path(tmp)
        make_source(work / "src", seq_mib, small)
        publish(work / "hub", "io", work / "src", "--block-size", str(BLOCK_SIZE))
        cache_mib = 2 * (8 * seq_mib + small // 16) + 64
        with LocalStack() as stack:
            hub = stack.start_hub(work / "hub")
            spokes = {"mount": "off", "passthrough": "auto"}
            for name, mode in spokes.items():
                stack.start_spoke(
                    hub,
                    work / f"cache-{name}",
                    work / f"mnt-{name}",
                    f"{cache_mib}MiB",
                    extra=("--passthrough", mode),
                )
                subprocess.run(  # warm the cache (first opens: nothing cached, no passthrough)
                    ["cat", *map(str, sorted((work / f"mnt-{name}" / "io" / "v1").rglob("*.*")))],
                    stdout=subprocess.DEVNULL,
                    check=True,
                )
            state, opens_before = _passthrough_opens(work / "mnt-passthrough")
            print(f"passthrough mount: {state}", flush=True)
            roots: dict[str, Path | None] = {
                "local": work / "src",
                "floor": work / "floor",
                "mount": work / "mnt-mount" / "io" / "v1",
                "passthrough": work / "mnt-passthrough" / "io" / "v1" if state == "on" else None,
            }
            with FloorMount(work / "src", work / "floor", work / "floor.log"):
                dropped = drop_page_cache(3)
                for job in jobs(seq_mib, small, runtime):
                    rows.append(_compare(job, roots))
            passed = _passthrough_opens(work / "mnt-passthrough")[1] - opens_before
    print(
        "\n| fio job | local MB/s | pyfuse3 floor MB/s | warm mount MB/s | passthrough MB/s "
        "| mount/local | mount/floor | passthrough/local |\n|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        pt = "n/a" if r["passthrough_mb_s"] is None else f"{r['passthrough_mb_s']:.0f}"
        ratio = "n/a" if r["passthrough_ratio"] is None else f"{r['passthrough_ratio']:.2f}"
        print(
            f"| {r['job']} | {float(r['local_mb_s']):.0f} | {float(r['floor_mb_s']):.0f} | "
            f"{float(r['mount_mb_s']):.0f} | {pt} | {float(r['ratio']):.2f} | "
            f"{float(r['floor_ratio']):.2f} | {ratio} |"
        )
    print(f"passthrough: {state}; {passed} opens of the jobs went passthrough")
    if not dropped:
        print("(page cache NOT dropped: not root; these are page-cache reads)")
    if ns.json:
        ns.json.write_text(
            json.dumps(
                {
                    "page_cache_dropped": dropped,
                    "passthrough": state,
                    "passthrough_opens": passed,
                    "rows": rows,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
