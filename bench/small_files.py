"""Small files: many 64 KiB files read once in shuffled order, local disk against a cold and a
warm Strata mount, side by side in one run.

    python -m bench.small_files [--files 20000] [--readers 8] [--quick] [--json FILE]
    python -m bench.small_files --scale --files 1000000 --file-bytes 4096

With ``--scale`` (:func:`scale_run`) the passes are: publish, the tree's load, a listing
and a ``stat`` of every file (local disk and mount, caches dropped), a prewarm of the
snapshot (no cold pass: an hour at a million files) and a warm pass, with the daemon's
and the mount's RSS per file.

Publishes ``--files`` files of 64 KiB (one block each; 1,000 to a directory) to a hub on
loopback (no WAN), and times three passes, each after dropping the kernel page cache
(root only), each with ``--readers`` threads taking files from one shuffled list (open,
read whole, close; every file once):

* **local disk**: the source files;
* **Strata cold**: a fresh spoke, empty cache (``--background-fill off``: every file is a
  demand miss). The snapshot's tree is loaded before the clock starts (one ``stat`` of its
  root; printed on its own), so the figure is the misses';
* **Strata warm**: the same spoke again in another order, every block on its disk;
* **over a WAN** (``--rtt-ms``, ``--rate``: 50 ms, 1 Gbit/s by default; ``--no-wan`` skips
  them), each on a fresh spoke with its defaults (background fill on) behind
  :mod:`bench.wan`: the job posting its read order first (``POST /v1/hints``, one stream,
  as ``strata-train fit --hints`` does), then the same job without hints. Their figure is
  link use: the bytes that crossed the link from the job's start (the post, the tree's
  load) to its last read, over what the link could carry meanwhile.

Prints files/s, the ratios to local, the hub's ReadBlocks streams and blocks served during
the cold pass (``strata_hub_requests_total{method="ReadBlocks"}``,
``strata_hub_blocks_served_total``, from the hub's ``--metrics``), and the spoke's demand
waits (``strata_spoke_demand_miss_seconds``: count and mean; one per EnsureBlocks call
with a miss, so misses that share a call count once). Targets (issue 25): cold ≥
2,000 files/s with 8 readers on loopback; over 50 ms / 1 Gbit/s with hints ≥ 80 % link
use.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.measure import LinkSampler, link_utilisation
from bench.procstat import cpu_seconds, rss_bytes, scrape, spoke_processes, total
from bench.wan import LinkSpec, WanProxy, parse_hostport, parse_rate
from deploy.local import LocalStack, admin_headers, drop_page_cache, free_port, publish

FILE_BYTES = 64 * 1024
PER_DIR = 1000


def make_source(
    root: Path, files: int, seed: int = 1, file_bytes: int = FILE_BYTES
) -> dict[str, str]:
    """``files`` random files of ``file_bytes`` under ``root``, 1,000 to a directory;
    returns their SHA-256 by relative path."""
    rng = random.Random(seed)
    sums: dict[str, str] = {}
    for i in range(files):
        rel = f"d{i // PER_DIR:03d}/f{i:06d}.bin"
        path = root / rel
        if i % PER_DIR == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
        data = rng.randbytes(file_bytes)
        path.write_bytes(data)
        sums[rel] = hashlib.sha256(data).hexdigest()
    return sums


def read_pass(root: Path, order: Sequence[str], readers: int) -> tuple[float, dict[str, str]]:
    """Read every file of ``order`` once with ``readers`` threads sharing one queue.

    Returns:
        Seconds the pass took, and each file's SHA-256.

    Raises:
        RuntimeError: a reader failed (the first error).
    """
    sums: dict[str, str] = {}
    errors: list[BaseException] = []
    it = iter(order)
    lock = threading.Lock()

    def reader() -> None:
        try:
            while True:
                with lock:
                    rel = next(it, None)
                if rel is None:
                    return
                fd = os.open(root / rel, os.O_RDONLY)
                try:
                    chunks = []
                    while data := os.read(fd, 1 << 20):
                        chunks.append(data)
                finally:
                    os.close(fd)
                sums[rel] = hashlib.sha256(b"".join(chunks)).hexdigest()
        except BaseException as err:  # reported by the caller
            errors.append(err)

    threads = [threading.Thread(target=reader) for _ in range(readers)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"a reader failed: {errors[0]!r}")
    return seconds, sums


def list_stat(root: Path) -> tuple[float, float, list[str]]:
    """List ``root``'s directories (as :func:`make_source` lays them out), then ``stat``
    each file in listing order, one thread; returns both passes' seconds and the paths."""
    started = time.perf_counter()
    rels = [
        f"{d.name}/{f.name}"
        for d in sorted(os.scandir(root), key=lambda e: e.name)
        for f in sorted(os.scandir(d.path), key=lambda e: e.name)
    ]
    listed = time.perf_counter()
    for rel in rels:
        os.stat(root / rel)
    return listed - started, time.perf_counter() - listed, rels


def scale_run(
    files: int, file_bytes: int, readers: int, seed: int, keep: Path | None = None
) -> dict[str, Any]:
    """The ``--scale`` passes (module docstring): seconds, and RSS per file in bytes
    (daemon, mount: after the tree's load, and at the end, less before the load); ``keep``
    is a work directory kept, whose hub is published once (``keep/published``).

    Raises:
        RuntimeError: a pass read wrong bytes or listed other files.
    """
    out: dict[str, Any] = {"files": files, "file_bytes": file_bytes, "readers": readers}
    with contextlib.ExitStack() as scope:
        if keep is None:
            keep = Path(scope.enter_context(tempfile.TemporaryDirectory(prefix="strata-")))
        work = keep
        started = time.perf_counter()
        sums = make_source(work / "src", files, file_bytes=file_bytes)
        out["make_s"] = time.perf_counter() - started
        print(f"wrote {files:,} files in {out['make_s']:.0f} s", flush=True)
        if not (work / "published").exists():
            started = time.perf_counter()
            publish(work / "hub", "small", work / "src")
            (work / "published").write_text(f"{time.perf_counter() - started:.1f}\n")
        out["publish_s"] = float((work / "published").read_text())
        print(f"published in {out['publish_s']:.0f} s", flush=True)
        with LocalStack() as stack:
            hub = stack.start_hub(work / "hub")
            cache_mib = 2 * files * max(file_bytes, 4096) // (1 << 20) + 1024
            extra = ("--background-fill", "off")
            admin = stack.start_spoke(
                hub, work / "cache", work / "mnt", f"{cache_mib}MiB", extra=extra
            )
            assert stack.spoke is not None
            pids = spoke_processes(stack.spoke.pid)
            root = work / "mnt" / "small" / "v1"
            time.sleep(1)
            idle = {k: rss_bytes(p) for k, p in pids.items()}
            started = time.perf_counter()
            for out["tree_load_tries"] in range(1, 4):  # the mount's call may time out
                try:
                    os.stat(root / min(sums))  # a file's lookup loads the tree
                    break
                except OSError as err:
                    print(f"tree load: {err}; again", flush=True)
            out["tree_load_s"] = time.perf_counter() - started
            time.sleep(1.5)
            loaded = {k: rss_bytes(p) for k, p in pids.items()}
            out["rss_per_file_loaded"] = {k: (loaded[k] - idle[k]) / files for k in pids}
            print(f"tree loaded in {out['tree_load_s']:.1f} s: {out['rss_per_file_loaded']}")
            for label, top in (("local", work / "src"), ("mount", root)):
                drop_page_cache(3)
                listed, statted, rels = list_stat(top)
                if sorted(rels) != sorted(sums):
                    raise RuntimeError(f"the {label} listing is not the files written")
                out[f"{label}_list_s"], out[f"{label}_stat_s"] = listed, statted
                print(f"{label}: list {listed:.1f} s, stat {statted:.1f} s", flush=True)
            started = time.perf_counter()
            body = {"dataset": "small", "ref": "v1", "paths": []}
            headers = admin_headers(work / "cache")
            with httpx.Client(base_url=admin, headers=headers, timeout=60) as client:
                job = client.post("/v1/prewarm", json=body).raise_for_status().json()
                while (state := client.get(f"/v1/jobs/{job['id']}").json())["state"] == "running":
                    time.sleep(1)
            if state["state"] != "done":
                raise RuntimeError(f"prewarm ended {state['state']}: {state}")
            out["prewarm_s"] = time.perf_counter() - started
            print(f"prewarmed in {out['prewarm_s']:.0f} s", flush=True)
            order = random.Random(seed).sample(sorted(sums), len(sums))
            for label, top in (("local", work / "src"), ("warm", root)):
                drop_page_cache(3)
                seconds, got = read_pass(top, order, readers)
                if got != sums:
                    raise RuntimeError(f"the {label} pass read wrong bytes")
                out[f"{label}_read_s"] = seconds
                print(f"{label} open+read: {files / seconds:,.0f} files/s", flush=True)
            end = {k: rss_bytes(p) for k, p in pids.items()}
            out["rss_per_file_end"] = {k: (end[k] - idle[k]) / files for k in pids}
    return out


def wan_pass(
    hub: str,
    work: Path,
    tag: str,
    order: Sequence[str],
    readers: int,
    link: LinkSpec,
    hints: bool,
    cache_size: str,
) -> dict[str, Any]:
    """One shuffled pass of ``order`` on a fresh spoke (its defaults) behind an emulated
    ``link`` to ``hub``; with ``hints`` the read order is posted first.

    Returns:
        ``seconds`` (the job: post, tree load and reads), ``files_s``, ``link_bytes``,
        ``link_use`` (0–1), ``tree_load_s`` and each file's SHA-256 (``sums``).

    Raises:
        httpx.HTTPStatusError: the spoke refused the hint.
        RuntimeError: a reader failed.
    """
    with (
        WanProxy(parse_hostport(hub), link) as wan,
        LinkSampler(wan) as sampler,
        LocalStack() as stack,
    ):
        cache, mnt = work / f"cache-{tag}", work / f"mnt-{tag}"
        admin = stack.start_spoke(wan.address, cache, mnt, cache_size)
        root = mnt / "small" / "v1"
        drop_page_cache(3)
        t0 = sampler.mark()
        if hints:
            body = {"dataset": "small", "ref": "v1", "paths": list(order), "stream": "bench"}
            headers = admin_headers(cache)
            httpx.post(
                f"{admin}/v1/hints", json=body, headers=headers, timeout=120
            ).raise_for_status()
        started = time.perf_counter()
        os.stat(root / order[0])  # loads the tree (already loaded by the hint's post)
        tree_s = time.perf_counter() - started
        _, sums = read_pass(root, order, readers)
        t1 = sampler.mark()
        down = sampler.down_bytes(t0, t1)
    return {
        "seconds": t1 - t0,
        "files_s": len(order) / (t1 - t0),
        "link_bytes": down,
        "link_use": link_utilisation(down, t1 - t0, link.rate_bps),
        "tree_load_s": tree_s,
        "sums": sums,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point: prints the table; ``--json`` also writes the figures."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.small_files",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="1,000 files (a smoke run)")
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument(
        "--spoke-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="more strata-spoke run flags, e.g. --spoke-flag=--passthrough=off",
    )
    parser.add_argument("--rtt-ms", type=float, default=50.0, help="the WAN passes' RTT")
    parser.add_argument("--rate", default="1Gbit", help="the WAN passes' rate, e.g. 1Gbit")
    parser.add_argument("--no-wan", action="store_true", help="skip the WAN passes")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--scale", action="store_true", help="the many-files passes (above)")
    parser.add_argument("--file-bytes", type=int, default=FILE_BYTES, help="with --scale")
    parser.add_argument("--keep", type=Path, help="with --scale: a work directory to keep")
    ns = parser.parse_args(argv)
    if ns.scale:
        scaled = scale_run(ns.files, ns.file_bytes, ns.readers, ns.seed, ns.keep)
        text = json.dumps(scaled, indent=2)
        print(text)
        if ns.json:
            ns.json.write_text(text + "\n")
        return 0
    link = LinkSpec(rtt_s=ns.rtt_ms / 1e3, rate_bps=parse_rate(ns.rate))
    files = 1000 if ns.quick else ns.files
    rng = random.Random(ns.seed)
    with tempfile.TemporaryDirectory(prefix="strata-small-files-") as tmp:
        work = Path(tmp)
        sums = make_source(work / "src", files)
        publish(work / "hub", "small", work / "src")
        names = sorted(sums)
        cold_order, warm_order, local_order = (rng.sample(names, len(names)) for _ in range(3))
        with LocalStack() as stack:
            metrics_port = free_port()
            hub = stack.start_hub(work / "hub", metrics=f"127.0.0.1:{metrics_port}")
            hub_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
            cache_mib = 2 * files * FILE_BYTES // (1 << 20) + 256
            extra = ("--background-fill", "off", *ns.spoke_flag)
            admin = stack.start_spoke(
                hub, work / "cache", work / "mnt", f"{cache_mib}MiB", extra=extra
            )
            root = work / "mnt" / "small" / "v1"
            dropped = drop_page_cache(3)
            local_s, local_sums = read_pass(work / "src", local_order, ns.readers)
            drop_page_cache(3)
            started = time.perf_counter()
            os.stat(root / names[0])  # a file's lookup loads the tree (the root's getattr
            # does not: before, the first pass's clock included the load)
            tree_s = time.perf_counter() - started
            assert stack.hub is not None and stack.spoke is not None
            pids = {"hub": stack.hub.pid, **spoke_processes(stack.spoke.pid)}
            auth = admin_headers(work / "cache")  # the admin port's /metrics: the node's token
            hub_before, spoke_before = scrape(hub_metrics), scrape(f"{admin}/metrics", auth)
            cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            print("cold pass", flush=True)
            cold_s, cold_sums = read_pass(root, cold_order, ns.readers)
            print("cold pass done", flush=True)
            cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
            hub_after, spoke_after = scrape(hub_metrics), scrape(f"{admin}/metrics", auth)
            drop_page_cache(3)
            cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            warm_s, warm_sums = read_pass(root, warm_order, ns.readers)
            warm_cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
            stack.stop_spoke()
            wan: dict[str, dict[str, Any]] = {}
            for tag, hinted in (("wan-hints", True), ("wan-fill", False)):
                if ns.no_wan:
                    break
                print(f"{tag} pass", flush=True)
                wan[tag] = wan_pass(
                    hub, work, tag, cold_order, ns.readers, link, hinted, f"{cache_mib}MiB"
                )
    passes = [("local", local_sums), ("cold", cold_sums), ("warm", warm_sums)]
    passes += [(tag, got.pop("sums")) for tag, got in wan.items()]
    for label, got in passes:
        if got != sums:
            print(f"bench.small_files: error: the {label} pass read wrong bytes", file=sys.stderr)
            return 1

    def delta(name: str, **labels: str) -> float:
        return total(hub_after, name, **labels) - total(hub_before, name, **labels)

    def spoke_delta(name: str) -> float:
        return total(spoke_after, name) - total(spoke_before, name)

    misses = spoke_delta("strata_spoke_demand_miss_seconds_count")
    miss_s = spoke_delta("strata_spoke_demand_miss_seconds_sum")
    result: dict[str, Any] = {
        "files": files,
        "file_bytes": FILE_BYTES,
        "readers": ns.readers,
        "page_cache_dropped": dropped,
        "spoke_flags": list(extra),
        "tree_load_s": tree_s,
        "local_files_s": files / local_s,
        "cold_files_s": files / cold_s,
        "warm_files_s": files / warm_s,
        "cold_readblocks_streams": delta("strata_hub_requests_total", method="ReadBlocks"),
        "cold_blocks_served": delta("strata_hub_blocks_served_total"),
        "cold_demand_misses": misses,
        "cold_demand_miss_mean_s": miss_s / misses if misses else None,
        "cold_cpu_ms_per_file": {name: 1e3 * sec / files for name, sec in cpu.items()},
        "warm_cpu_ms_per_file": {name: 1e3 * sec / files for name, sec in warm_cpu.items()},
        "wan": {"link": link.describe(), **wan},
    }
    local = result["local_files_s"]
    print(f"| {files} files of 64 KiB, {ns.readers} readers | files/s | / local |")
    print("|---|---|---|")
    print(f"| local disk | {local:,.0f} | 1.00 |")
    for key, label in (("cold", "Strata cold (empty spoke)"), ("warm", "Strata warm")):
        rate = result[f"{key}_files_s"]
        print(f"| {label} | {rate:,.0f} | {rate / local:.2f} |")
    for tag, label in (("wan-hints", "with hints"), ("wan-fill", "no hints, fill on")):
        if tag in wan:
            row = wan[tag]
            print(
                f"| Strata cold over {link.describe()}, {label} | {row['files_s']:,.0f} | "
                f"{row['files_s'] / local:.2f} | link use {100 * row['link_use']:.0f} % "
                f"({row['link_bytes'] / 1e6:,.0f} MB in {row['seconds']:.1f} s, tree "
                f"{row['tree_load_s']:.2f} s) |"
            )
    mean = result["cold_demand_miss_mean_s"]
    print(
        f"cold: {result['cold_readblocks_streams']:.0f} ReadBlocks streams at the hub for "
        f"{result['cold_blocks_served']:.0f} blocks; {misses:.0f} demand waits at the spoke "
        "(misses sharing a call count once)"
        + (f", {mean * 1e3:.1f} ms each on average" if mean is not None else "")
        + f"; tree loaded in {tree_s:.2f} s before the clock"
    )
    for key in ("cold", "warm"):
        cpu_ms = result[f"{key}_cpu_ms_per_file"]
        print(
            f"{key}: CPU per file "
            + ", ".join(f"{k} {v:.2f} ms" for k, v in cpu_ms.items())
            + f" (all {sum(cpu_ms.values()):.2f} ms)"
        )
    if not dropped:
        print("(page cache NOT dropped: not root)")
    if ns.json:
        ns.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
