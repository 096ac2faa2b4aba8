"""Peak memory of a hub and a spoke under load: what the Kubernetes limits are sized from.

    python -m bench.rss [--size 1GiB] [--files 64] [--cache-size 512MiB] [--json FILE]
                        [--blobs s3://BUCKET/PREFIX --s3-endpoint URL]

Publishes ``--files`` random files totalling ``--size`` bytes (4 MiB blocks, the default),
starts a hub and a spoke (daemon + mount) on 127.0.0.1, and reads every file through the
mount twice: a cold pass (every block a miss, fetched from the hub) and a second pass.
With ``--cache-size`` below ``--size`` the second pass evicts as it goes, which exercises
the policy too. While that runs, a sampler reads ``VmRSS`` of every process of the hub's
and the spoke's process trees from ``/proc`` every 50 ms and keeps the peak of each
tree's sum (a page shared by two processes of a tree counts twice: an upper bound).

The numbers feed ``resources`` in deploy/k8s/base/{hub,spoke}/: the request is the peak
rounded up, the limit about twice that. With ``--blobs s3://...`` the hub keeps its
blocks in that bucket (credentials from the usual AWS environment variables), as the
Kubernetes hub does. Needs /dev/fuse.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.data import parse_size
from deploy.local import LocalStack, publish

MiB = 1 << 20


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc/*/stat."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def tree_rss_bytes(pid: int) -> int:
    """Sum of ``VmRSS`` over ``pid`` and all its descendants, bytes (0 if it is gone)."""
    tree = _children()
    todo, total = [pid], 0
    while todo:
        current = todo.pop()
        todo.extend(tree.get(current, []))
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


class PeakSampler:
    """Samples :func:`tree_rss_bytes` of some pids on a thread; keeps each one's peak."""

    def __init__(self, pids: dict[str, int], period: float = 0.05) -> None:
        self.pids = pids
        self.peak = dict.fromkeys(pids, 0)
        self._period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], tree_rss_bytes(pid))
            self._stop.wait(self._period)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class Result:
    """Peak resident memory, MiB, and what was read."""

    dataset_bytes: int
    cache_bytes: int
    hub_idle_mib: float
    spoke_idle_mib: float
    hub_peak_mib: float
    spoke_peak_mib: float
    read_bytes: int


def _read_all(root: Path) -> int:
    total = 0
    for path in sorted(root.iterdir()):
        with open(path, "rb") as stream:
            while chunk := stream.read(MiB):
                total += len(chunk)
    return total


def run(size: int, files: int, cache_size: int, blobs: str | None = None) -> Result:
    """One measurement (see the module docstring)."""
    tmp = Path(tempfile.mkdtemp(prefix="strata-rss-"))
    try:
        src = tmp / "src"
        src.mkdir()
        for index in range(files):
            (src / f"part-{index:04d}.bin").write_bytes(os.urandom(size // files))
        publish(tmp / "hub", "rss", src, *(["--blobs", blobs] if blobs else []))
        with LocalStack() as stack:
            hub = stack.start_hub(tmp / "hub")
            stack.start_spoke(hub, tmp / "cache", tmp / "mnt", str(cache_size))
            assert stack.hub is not None and stack.spoke is not None
            pids = {"hub": stack.hub.pid, "spoke": stack.spoke.pid}
            idle = {name: tree_rss_bytes(pid) for name, pid in pids.items()}
            with PeakSampler(pids) as sampler:
                root = tmp / "mnt" / "rss" / "latest"
                read = _read_all(root) + _read_all(root)
        return Result(
            dataset_bytes=size,
            cache_bytes=cache_size,
            hub_idle_mib=round(idle["hub"] / MiB, 1),
            spoke_idle_mib=round(idle["spoke"] / MiB, 1),
            hub_peak_mib=round(sampler.peak["hub"] / MiB, 1),
            spoke_peak_mib=round(sampler.peak["spoke"] / MiB, 1),
            read_bytes=read,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rss", description=__doc__)
    parser.add_argument("--size", default="1GiB", help="dataset bytes (default 1GiB)")
    parser.add_argument("--files", type=int, default=64, help="files (default 64)")
    parser.add_argument("--cache-size", default="512MiB", help="spoke cache (default 512MiB)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--blobs", help="the hub's blob store, e.g. s3://bucket/blobs")
    parser.add_argument("--s3-endpoint", help="S3 endpoint URL for --blobs s3://...")
    args = parser.parse_args(argv)
    try:
        size, cache = parse_size(args.size), parse_size(args.cache_size)
    except ValueError as exc:
        print(f"bench.rss: error: {exc}", file=sys.stderr)
        return 2
    if args.files < 1 or size < args.files:
        print("bench.rss: error: --files must be between 1 and --size bytes", file=sys.stderr)
        return 2
    if args.s3_endpoint:  # read by publish and by the hub it starts
        os.environ["STRATA_HUB_S3_ENDPOINT"] = args.s3_endpoint
    result = run(size, args.files, cache, args.blobs)
    print(
        f"blobs {args.blobs or 'local'}: dataset {size / MiB:.0f} MiB, "
        f"cache {cache / MiB:.0f} MiB, read "
        f"{result.read_bytes / MiB:.0f} MiB: hub idle {result.hub_idle_mib} MiB, "
        f"peak {result.hub_peak_mib} MiB; spoke (supervisor+daemon+mount) idle "
        f"{result.spoke_idle_mib} MiB, peak {result.spoke_peak_mib} MiB"
    )
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
