"""Warm reads through the container image's mount against local disk (issue 44's target:
the container's warm sequential read ≥ 0.9× local, by FUSE passthrough).

    python -m bench.container_read [--quick] [--image localhost/strata:ci] [--json FILE]

The same files and fio jobs as :mod:`bench.mount_io` (sequential 1 MiB reads, 4 jobs; one
reader; random 1 MiB; 64 KiB files read whole), published with 64 MiB blocks so each file
is one block, on three rows measured in one run, page cache dropped before each job:

* **local** — the source files on this machine's disk;
* **host spoke** — ``strata-spoke`` run from this checkout (:class:`deploy.local.LocalStack`),
  warm, ``--passthrough auto``;
* **container** — the image's hub and spoke as the manifests run them
  (:mod:`deploy.containers`: podman, host network, a privileged spoke whose mount reaches
  the host through an rshared volume), warm, passthrough by default.

Prints MB/s and container/local, container/host ratios, and how many opens of the jobs
the container's mount handed to the kernel (``user.strata.passthrough_opens``). Needs
root, fio, podman, runc, mmdebstrap and /dev/fuse; builds the image unless ``--image``
names one already built.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.mount_io import BLOCK_SIZE, Job, jobs, make_source, run_fio
from deploy.containers import (
    container,
    hub_serving,
    shared_mount,
    spoke_args,
    spoke_command,
    wait_until,
)
from deploy.image import build
from deploy.imagerun import REPO
from deploy.local import LocalStack, drop_page_cache, free_port, publish

ROWS = ("local", "host spoke", "container")
KEPT_JOBS = ("seq 1M", "seq 1M x1", "rand 1M", "small files 64k")


def _warm(root: Path) -> None:
    """Reads every file under ``root`` once (the cache fills; later opens pass through)."""
    files = sorted(str(p) for p in root.rglob("*.*") if p.is_file())
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)


def _opens(mnt: Path) -> tuple[str, int]:
    state = os.getxattr(mnt, "user.strata.passthrough").decode()
    return state, int(os.getxattr(mnt, "user.strata.passthrough_opens"))


def _row(job: Job, roots: dict[str, Path]) -> dict[str, Any]:
    figures = {}
    for name in ROWS:
        drop_page_cache(3)
        figures[name] = run_fio(job, roots[name])
    local, host, box = (figures[k] for k in ROWS)
    row = {
        "job": job.name,
        **{f"{k.replace(' ', '_')}_mb_s": v for k, v in figures.items()},
        "container_local": box / local if local else 0.0,
        "container_host": box / host if host else 0.0,
    }
    print(
        f"{job.name:>16}: local {local:7.0f}  host spoke {host:7.0f}  container {box:7.0f} "
        f"MB/s  container/local {row['container_local']:.2f}  "
        f"container/host {row['container_host']:.2f}",
        flush=True,
    )
    return row


def measure(work: Path, image: str, seq_mib: int, small: int, runtime: int) -> dict[str, Any]:
    """The three rows of every kept job over files made under ``work``."""
    src = work / "src"
    make_source(src, seq_mib, small)
    cache_mib = 2 * (8 * seq_mib + small // 16) + 64
    publish(work / "hub-local", "io", src, "--block-size", str(BLOCK_SIZE))
    name = f"strata-bench-{os.getpid()}"
    with (
        LocalStack() as stack,
        hub_serving(image, work, src, name, block_size=BLOCK_SIZE) as hub_port,
        shared_mount(work / "root") as root,
    ):
        hub = stack.start_hub(work / "hub-local")
        host_mnt = work / "mnt-host"
        stack.start_spoke(
            hub, work / "cache-host", host_mnt, f"{cache_mib}MiB", extra=("--passthrough", "auto")
        )
        (root / "data").mkdir()
        (work / "cache-box").mkdir()
        command = spoke_command(hub_port, free_port(), cache_size=f"{cache_mib}MiB")
        args = spoke_args(work / "cache-box", root)
        with container(f"{name}-spoke", image, *args, command=command) as spoke:
            box_mnt = root / "data"
            wait_until(lambda: os.path.ismount(box_mnt), spoke, "the mount reaches the host")
            roots = {
                "local": src,
                "host spoke": host_mnt / "io" / "v1",
                "container": box_mnt / "demo" / "v1",
            }
            for name_ in ROWS[1:]:
                _warm(roots[name_])
            host_state, _ = _opens(host_mnt)
            box_state, before = _opens(box_mnt)
            print(f"passthrough: host spoke {host_state}, container {box_state}", flush=True)
            rows = [
                _row(job, roots) for job in jobs(seq_mib, small, runtime) if job.name in KEPT_JOBS
            ]
            passed = _opens(box_mnt)[1] - before
    return {
        "image": image,
        "passthrough": {"host": host_state, "container": box_state},
        "container_passthrough_opens": passed,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point: prints the table; ``--json`` also writes the figures."""
    p = argparse.ArgumentParser(prog="python -m bench.container_read", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--seq-mib", type=int, default=64, help="MiB per sequential file (≤ 64)")
    p.add_argument("--small-files", type=int, default=4000)
    p.add_argument("--runtime", type=int, default=8, help="seconds per random job")
    p.add_argument("--image", default=None, help="an image already built (default: build it)")
    p.add_argument("--json", type=Path, default=None)
    ns = p.parse_args(argv)
    missing = [t for t in ("fio", "podman", "runc", "mmdebstrap") if shutil.which(t) is None]
    if missing or os.getuid() != 0:
        why = f"missing {', '.join(missing)}" if missing else "needs root"
        print(f"bench.container_read: error: {why}", file=sys.stderr)
        return 2
    image = ns.image or build("runtime", "ci", REPO / "build" / "image")
    seq_mib, small, runtime = (8, 400, 2) if ns.quick else (ns.seq_mib, ns.small_files, ns.runtime)
    with tempfile.TemporaryDirectory(prefix="strata-container-read-") as tmp:
        result = measure(Path(tmp), image, seq_mib, small, runtime)
    print(
        "\n| fio job | local MB/s | host spoke MB/s | container MB/s | container/local "
        "| container/host |\n|---|---|---|---|---|---|"
    )
    for r in result["rows"]:
        print(
            f"| {r['job']} | {r['local_mb_s']:.0f} | {r['host_spoke_mb_s']:.0f} | "
            f"{r['container_mb_s']:.0f} | {r['container_local']:.2f} | {r['container_host']:.2f} |"
        )
    print(
        f"passthrough: {result['passthrough']}; "
        f"{result['container_passthrough_opens']} opens of the jobs went passthrough "
        "in the container"
    )
    if ns.json:
        ns.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
