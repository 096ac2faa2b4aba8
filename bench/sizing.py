"""A spoke's resident memory per loaded manifest file, per cached block and per hint entry.

    python -m bench.sizing [--files 20000,100000] [--blocks 5000,10000,20000]
                           [--hint-streams 5] [--json FILE]

Publishes one data set per ``--files`` count (``mN``: N files of 9 bytes, each its own
block, 1,000 to a directory), starts a hub and a spoke (supervisor + daemon + mount) on
127.0.0.1 the way :class:`deploy.local.LocalStack` does, and reads ``VmRSS`` of the
spoke's daemon and mount processes from ``/proc`` after each step (1 s after it ends):

1. **manifest**: ``stat`` one file of each data set through the mount, smallest first,
   which loads that snapshot's whole manifest; the RSS each load adds, over its file count,
   is the cost of a loaded manifest file.
2. **blocks**: ``POST /v1/prewarm`` of the smallest data set's directories until
   ``--blocks`` blocks are cached, one count after another; the slope of RSS over cached
   blocks is the cost of a cached block (the cache index, its policy's entry, the
   catalog's row cached in memory).
3. **hints**: ``POST /v1/hints`` of every file of the smallest data set (already cached,
   so nothing is fetched) on ``--hint-streams`` streams, one after another; the slope of
   RSS over planned reads is the cost of a hint entry.

The daemon and mount are measured apart (the supervisor is small and constant). A page
shared by two processes counts twice, so the sums are an upper bound. Python's allocator
does not hand freed memory back, so the figures are what a long-running spoke keeps.
Needs /dev/fuse (root). Run by hand; not in ``make bench`` or ``make test``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from deploy.local import LocalStack, admin_headers, publish

MiB = 1 << 20
PER_DIR = 1000


def _rss(pid: int) -> int:
    """``VmRSS`` of one process, bytes (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            out.append(int(entry))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def spoke_processes(supervisor: int) -> dict[str, int]:
    """``{"supervisor": pid, "daemon": pid, "mount": pid}`` of a ``strata-spoke run``."""
    procs = {"supervisor": supervisor}
    for child in _children(supervisor):
        argv = _cmdline(child).split()
        module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
        if module in ("spoke", "fusemount"):
            procs["mount" if module == "fusemount" else "daemon"] = child
    return procs


def make_tree(src: Path, name: str, files: int) -> list[str]:
    """``files`` files of distinct 9-byte contents (one block each, none shared)."""
    paths = []
    for index in range(files):
        rel = f"d{index // PER_DIR:04d}/f{index:07d}"
        path = src / rel
        if index % PER_DIR == 0:
            path.parent.mkdir(parents=True)
        path.write_bytes(f"{name[:1]}{index:07d}\n".encode())
        paths.append(rel)
    return paths


@dataclass
class Sample:
    """RSS of the spoke's processes after one step, MiB."""

    step: str
    x: int  # files loaded, blocks cached or hint entries installed so far
    daemon_mib: float
    mount_mib: float
    supervisor_mib: float


@dataclass
class Result:
    """Every sample and the slopes drawn from them, bytes per unit."""

    samples: list[Sample] = field(default_factory=list)
    per_manifest_file: dict[str, float] = field(default_factory=dict)
    per_block: dict[str, float] = field(default_factory=dict)
    per_hint_entry: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def _sample(procs: dict[str, int], step: str, x: int) -> Sample:
    time.sleep(1.0)
    rss = {name: _rss(pid) / MiB for name, pid in procs.items()}
    sample = Sample(
        step,
        x,
        round(rss.get("daemon", 0.0), 1),
        round(rss.get("mount", 0.0), 1),
        round(rss["supervisor"], 1),
    )
    print(
        f"  {step:<10} x={x:>8,}: daemon {sample.daemon_mib:7.1f} MiB, "
        f"mount {sample.mount_mib:7.1f} MiB",
        flush=True,
    )
    return sample


def _slope(first: Sample, last: Sample) -> dict[str, float]:
    """Bytes per unit of x between two samples, daemon, mount and both."""
    span = max(1, last.x - first.x)
    daemon = (last.daemon_mib - first.daemon_mib) * MiB / span
    mount = (last.mount_mib - first.mount_mib) * MiB / span
    return {"daemon": round(daemon), "mount": round(mount), "both": round(daemon + mount)}


def _wait_job(client: httpx.Client, job_id: str, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] != "running":
            if job["state"] != "done":
                raise RuntimeError(f"prewarm job ended {job['state']}: {job}")
            return
        time.sleep(0.5)
    raise TimeoutError(f"prewarm job {job_id} still running after {timeout:.0f} s")


def run(files: list[int], blocks: list[int], hint_streams: int) -> Result:
    """One measurement (see the module docstring)."""
    files = sorted(files)
    blocks = sorted(b for b in blocks if b <= files[0])
    result = Result()
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="strata-sizing-"))
    try:
        listing: dict[str, list[str]] = {}
        for count in files:
            name = f"m{count}"
            src = tmp / "src" / name
            listing[name] = make_tree(src, name, count)
            publish(tmp / "hub", name, src)
            shutil.rmtree(src)
            print(f"published {name}: {count:,} files", flush=True)
        with LocalStack() as stack:
            hub = stack.start_hub(tmp / "hub")
            url = stack.start_spoke(hub, tmp / "cache", tmp / "mnt", "4GiB")
            assert stack.spoke is not None
            procs = spoke_processes(stack.spoke.pid)
            headers = admin_headers(tmp / "cache")
            with httpx.Client(base_url=url, headers=headers, timeout=600.0) as client:
                base = _sample(procs, "idle", 0)
                result.samples.append(base)
                # 1. manifests
                loaded, previous = 0, base
                for count in files:
                    name = f"m{count}"
                    os.stat(tmp / "mnt" / name / "latest" / listing[name][0])
                    loaded += count
                    now = _sample(procs, f"manifest {name}", loaded)
                    result.samples.append(now)
                    result.per_manifest_file[name] = _slope(previous, now)["both"]
                    previous = now
                result.per_manifest_file.update(
                    {f"all {k}": v for k, v in _slope(base, previous).items()}
                )
                # 2. blocks
                smallest = f"m{files[0]}"
                first = cached = None
                done = 0
                for target in blocks:
                    dirs = [f"d{i:04d}" for i in range(done // PER_DIR, target // PER_DIR)]
                    if dirs:
                        reply = client.post(
                            "/v1/prewarm", json={"dataset": smallest, "paths": dirs}
                        )
                        reply.raise_for_status()
                        _wait_job(client, reply.json()["id"])
                    done = target // PER_DIR * PER_DIR
                    cached = _sample(procs, "blocks", done)
                    result.samples.append(cached)
                    first = first or cached
                if first is not None and cached is not None:
                    result.per_block = _slope(first, cached)
                # 3. hints
                first = hinted = None
                paths = listing[smallest]
                for stream in range(hint_streams + 1):
                    if stream:
                        reply = client.post(
                            "/v1/hints",
                            json={"dataset": smallest, "paths": paths, "stream": f"s{stream}"},
                        )
                        reply.raise_for_status()
                    hinted = _sample(procs, "hints", stream * len(paths))
                    result.samples.append(hinted)
                    first = first or hinted
                if first is not None and hinted is not None:
                    result.per_hint_entry = _slope(first, hinted)
        result.seconds = round(time.monotonic() - started, 1)
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _counts(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sizing", description=__doc__)
    parser.add_argument(
        "--files", type=_counts, default=[20000, 100000], help="data sets' file counts"
    )
    parser.add_argument(
        "--blocks",
        type=_counts,
        default=[5000, 10000, 20000],
        help="cached block counts to sample (at most the smallest --files)",
    )
    parser.add_argument("--hint-streams", type=int, default=5, help="hint streams (default 5)")
    parser.add_argument("--json", type=Path, help="also write the samples and slopes here")
    args = parser.parse_args(argv)
    if not args.files or min(args.files) < PER_DIR or args.hint_streams < 1:
        print("bench.sizing: error: --files >= 1000 each, --hint-streams >= 1", file=sys.stderr)
        return 2
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    result = run(args.files, args.blocks, args.hint_streams)
    print(f"done in {result.seconds:.0f} s; bytes of RSS (daemon + mount) per unit:")
    for name, value in result.per_manifest_file.items():
        print(f"  per loaded manifest file ({name}): {value:,.0f}")
    for name, value in result.per_block.items():
        print(f"  per cached block ({name}): {value:,.0f}")
    for name, value in result.per_hint_entry.items():
        print(f"  per hint entry ({name}): {value:,.0f}")
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
