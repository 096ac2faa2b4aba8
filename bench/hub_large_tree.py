"""Publishing and serving a snapshot of many small files (default 1,000,000).

    python -m bench.hub_large_tree [--files 1000000] [--dirs 1000] [--file-bytes 100]
                                   [--work DIR] [--json FILE]

1. writes ``--files`` distinct small files in ``--dirs`` directories;
2. publishes them with ``strata-hub publish`` in a child process and reports its wall
   time and peak RSS (``ru_maxrss`` of that process alone, from ``wait4``), split by
   sampling ``/proc/PID/status`` every 0.2 s into anonymous memory (the process's own:
   Python objects, buffers) and file-backed pages (the LMDB map's pages it touched, which
   are the kernel's page cache, shared and reclaimable), next to the RSS of a child that
   only imports the hub (the interpreter's floor) and to the memory one copy of the tree
   takes as Python objects (tracemalloc on a sample of the manifest, scaled up);
3. starts the hub and measures, side by side: streaming the whole manifest through
   GetManifest (checking path order) against listing one directory with ListDirectory
   (which reads that directory's index range only), and the catalog entries each decodes.

Leaves nothing behind unless ``--work`` names a directory to keep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import grpc

import hub.catalog.txn as catalog_module
from hub.catalog import Catalog
from hub.serve.serverthread import ServerThread
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc

SAMPLE_ENTRIES = 10_000


def make_tree(root: Path, files: int, dirs: int, file_bytes: int) -> None:
    """``files`` distinct files of ``file_bytes`` bytes, spread over ``dirs`` directories."""
    per_dir = -(-files // dirs)
    written = 0
    for d in range(dirs):
        directory = root / f"shard-{d:05d}"
        directory.mkdir(parents=True)
        for f in range(min(per_dir, files - written)):
            label = f"{d}/{f}:".encode()
            (directory / f"sample-{f:07d}.bin").write_bytes(label.ljust(file_bytes, b"."))
            written += 1


def _rss_split(pid: int) -> tuple[int, int]:
    """(anonymous, file-backed) resident bytes of a process, from /proc/PID/status."""
    values = {"RssAnon:": 0, "RssFile:": 0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition("\t")
            if key in values:
                values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return values["RssAnon:"], values["RssFile:"]


def run_child(args: list[str], peaks: dict[str, int] | None = None) -> tuple[float, int]:
    """Runs a child process; returns (wall seconds, its own peak RSS in bytes).

    With ``peaks``, also records the peak anonymous and file-backed RSS seen by sampling.
    """
    started = time.perf_counter()
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG if peaks is not None else 0)
        if pid:
            break
        assert peaks is not None
        anon, file = _rss_split(process.pid)
        peaks["anon"] = max(peaks.get("anon", 0), anon)
        peaks["file"] = max(peaks.get("file", 0), file)
        time.sleep(0.2)
    elapsed = time.perf_counter() - started
    assert process.stdout is not None and process.stderr is not None
    out, err = process.stdout.read(), process.stderr.read()
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4 above
    if process.returncode != 0:
        raise SystemExit(f"{args[3:5]} failed: {err.decode()}")
    sys.stderr.write(err.decode())
    del out
    return elapsed, usage.ru_maxrss * 1024  # Linux reports KiB


def tree_bytes(data: Path, entries: int) -> int:
    """Bytes one copy of the manifest takes as Python objects (sampled, scaled up)."""
    with Catalog(data / "catalog") as catalog:
        snapshot = catalog.resolve("large", "latest")
        tracemalloc.start()
        try:
            sample = catalog.manifest_page(snapshot.snapshot_id, 0, SAMPLE_ENTRIES)
            held = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    return held * entries // max(1, len(sample))


def serve_checks(data: Path, dirs: int) -> dict[str, Any]:
    """GetManifest of everything vs ListDirectory of one directory, through gRPC."""
    decoded = 0
    real_decode = catalog_module.decode_entry

    def counting(value: bytes) -> Any:
        nonlocal decoded
        decoded += 1
        return real_decode(value)

    catalog_module.decode_entry = counting  # type: ignore[assignment]
    try:
        with (
            ServerThread(data) as server,
            grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel,
        ):
            stub = hub_pb2_grpc.HubStub(channel)
            decoded = 0
            started = time.perf_counter()
            last, count, in_order = "", 0, True
            request = hub_pb2.GetManifestRequest(dataset="large", ref="latest")
            for entry in stub.GetManifest(request, timeout=3600):
                in_order = in_order and entry.path > last
                last, count = entry.path, count + 1
            manifest_s, manifest_decoded = time.perf_counter() - started, decoded
            directory = f"shard-{dirs // 2:05d}"
            decoded = 0
            started = time.perf_counter()
            listed = 0
            token = ""
            while True:
                page = stub.ListDirectory(
                    hub_pb2.ListDirectoryRequest(
                        dataset="large", ref="latest", path=directory, page_token=token
                    ),
                    timeout=60,
                )
                listed += len(page.entries)
                token = page.next_page_token
                if not token:
                    break
            listing_s, listing_decoded = time.perf_counter() - started, decoded
    finally:
        catalog_module.decode_entry = real_decode
    return {
        "manifest_entries": count,
        "manifest_in_path_order": in_order,
        "manifest_stream_s": manifest_s,
        "manifest_entries_decoded": manifest_decoded,
        "directory": directory,
        "directory_entries": listed,
        "directory_list_s": listing_s,
        "directory_entries_decoded": listing_decoded,
    }


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m bench.hub_large_tree", description=__doc__)
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--dirs", type=int, default=1000)
    parser.add_argument("--file-bytes", type=int, default=100)
    parser.add_argument("--work", type=Path, help="keep the tree and data dir here")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="strata-large-"))
    try:
        src, data = work / "src", work / "data"
        started = time.perf_counter()
        if not src.exists():
            make_tree(src, args.files, args.dirs, args.file_bytes)
        tree_s = time.perf_counter() - started
        python = [sys.executable, "-m"]
        _, floor_rss = run_child([sys.executable, "-c", "import hub.cli.main, hub.publish.tree"])
        shutil.rmtree(data, ignore_errors=True)
        peaks: dict[str, int] = {}
        publish_s, publish_rss = run_child(
            [*python, "hub", "publish", "--data-dir", str(data), "large", str(src)], peaks
        )
        entries = args.files + args.dirs
        results: dict[str, Any] = {
            "files": args.files,
            "dirs": args.dirs,
            "file_bytes": args.file_bytes,
            "tree_write_s": tree_s,
            "publish_s": publish_s,
            "publish_files_per_s": args.files / publish_s,
            "publish_peak_rss_bytes": publish_rss,
            "publish_peak_anon_rss_bytes": peaks.get("anon", 0),
            "publish_peak_file_rss_bytes": peaks.get("file", 0),
            "import_only_rss_bytes": floor_rss,
            "tree_as_python_objects_bytes": tree_bytes(data, entries),
        }
        results |= serve_checks(data, args.dirs)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    mib = 1024 * 1024
    r, mib = results, 1024 * 1024
    print(f"large tree: {args.files} files of {args.file_bytes} bytes in {args.dirs} directories")
    print(f"  publish          {r['publish_s']:9.1f} s  ({r['publish_files_per_s']:.0f} files/s)")
    print(
        f"  publish peak RSS {r['publish_peak_rss_bytes'] / mib:9.1f} MiB"
        f"  (anonymous {r['publish_peak_anon_rss_bytes'] / mib:.1f} MiB, LMDB map pages"
        f" {r['publish_peak_file_rss_bytes'] / mib:.1f} MiB; import-only floor"
        f" {r['import_only_rss_bytes'] / mib:.1f} MiB; the tree once as Python objects"
        f" {r['tree_as_python_objects_bytes'] / mib:.0f} MiB)"
    )
    print(
        f"  GetManifest      {r['manifest_stream_s']:9.2f} s  {r['manifest_entries']} entries,"
        f" path order {r['manifest_in_path_order']}, {r['manifest_entries_decoded']} decoded"
    )
    print(
        f"  ListDirectory    {r['directory_list_s']:9.4f} s  {r['directory_entries']} entries"
        f" of {r['directory']}, {r['directory_entries_decoded']} decoded"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
