"""Ingest on loopback: what a spoke spends to bring a GiB onto its disk, beside the floor.

    python -m bench.ingest [--size 1GiB] [--only large,chunks,small] [--json FILE]
                           [--paths floor,floor-direct,grpc,bulk1,bulk2,cold-grpc,
                                    cold-bulk,grpc-tls,bulk2-tls]

For each shape of data set (random bytes published to a local hub; the hub on 127.0.0.1
with no WAN emulator in the way, so the machine's CPU is the only limit), one run of each
path, every one from an empty cache with the page cache dropped first (when this process
may: root):

* ``floor``: a minimal Python receiver (:func:`floor_receive`, a child process): one TCP
  connection to the hub's bulk port, 16 blocks a request, ``recv_into`` one reused
  buffer, xxh3-128, ``write`` to a new file per block. What the machine allows a Python
  process that does only that.
* ``floor-direct``: the same receiver writing each block with ``O_DIRECT``, as the spoke
  writes the blocks it fetches ahead of readers (:mod:`spoke.cache.staging`): the floor
  of that write.
* ``grpc``: ``POST /v1/prewarm`` of everything, blocks over gRPC ``ReadBlocks`` (the
  default).
* ``bulk1``, ``bulk2``: the same prewarm over the bulk channel (``--hub-bulk-port``)
  with 1 and 2 ``--fetch-workers``.
* ``grpc-tls``, ``bulk2-tls``: ``grpc`` and ``bulk2`` with mutual TLS between hub and
  spoke (one throwaway CA, :mod:`deploy.pki`), as a deployment runs them: what TLS costs.
* ``cold-grpc``, ``cold-bulk``: ``--background-fill off``, every file read once through
  the mount by 4 threads (8 for small files), 1 MiB reads, over gRPC and over the bulk
  channel (2 workers).

Each row: MB/s (10^6 B/s) and CPU seconds per GiB of the hub, the spoke's daemon and its
mount process (and of the readers, or of the floor receiver), from ``/proc``. Shapes:
``large`` 64 MiB files of 4 MiB blocks; ``chunks`` 1 MiB files (a Zarr store's chunks);
``small`` 64 KiB files (per-block costs dominate), at a quarter of ``--size``. Needs
/dev/fuse for every path but ``floor``.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import xxhash

from bench.data import parse_size
from bench.measure import read_groups, tree_cpu_seconds
from deploy.local import LocalStack, admin_headers, publish
from deploy.pki import LocalCa
from protocol import bulk
from spoke.cache.staging import DirectWrites, write_block_file

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class Shape:
    """A data set's shape: file and block size, bytes; share of ``--size``; readers."""

    name: str
    file_bytes: int
    block_bytes: int
    share: float
    readers: int
    what: str


SHAPES = {
    s.name: s
    for s in (
        Shape("large", 64 * MiB, 4 * MiB, 1.0, 4, "64 MiB files, 4 MiB blocks"),
        Shape("chunks", MiB, MiB, 0.5, 4, "1 MiB chunk files"),
        Shape("small", 64 << 10, 64 << 10, 0.125, 8, "64 KiB files"),
    )
}

PATHS = (
    "floor",
    "floor-direct",
    "grpc",
    "bulk1",
    "bulk2",
    "cold-grpc",
    "cold-bulk",
    "grpc-tls",
    "bulk2-tls",
)


@dataclass
class Row:
    """One path's run on one shape."""

    shape: str
    path: str
    bytes: int
    files: int
    seconds: float
    hub_cpu_s: float
    daemon_cpu_s: float
    mount_cpu_s: float
    client_cpu_s: float

    @property
    def mb_s(self) -> float:
        """Bytes per second, 10^6."""
        return self.bytes / self.seconds / 1e6

    def per_gib(self, cpu_s: float) -> float:
        """CPU seconds per GiB of this run."""
        return cpu_s / (self.bytes / GiB) if self.bytes else 0.0


def drop_caches() -> bool:
    """Drops the page cache (root only); False where this process may not."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    except OSError:
        return False
    return True


def spoke_cpu(supervisor: int) -> tuple[float, float]:
    """CPU seconds so far of a spoke's daemon and of its mount process (each with its
    own children), told apart by their command lines."""
    daemon = mount = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) != supervisor:
            continue
        if b"fusemount" in cmdline or b" mount " in cmdline:
            mount += tree_cpu_seconds(int(entry.name))
        elif b"daemon" in cmdline:
            daemon += tree_cpu_seconds(int(entry.name))
    return daemon, mount


def make_source(root: Path, shape: Shape, size: int) -> int:
    """Random files of ``shape`` under ``root``, ``size`` bytes in all; returns files."""
    root.mkdir(parents=True)
    files = max(1, size // shape.file_bytes)
    for i in range(files):
        (root / f"f{i:06d}.bin").write_bytes(os.urandom(shape.file_bytes))
    return files


def blob_digests(hub_dir: Path) -> list[tuple[str, int]]:
    """Every block of the hub's local blob store, ``(digest, size)``, in name order."""
    return sorted(
        (p.name, p.stat().st_size)
        for p in (hub_dir / "blobs").glob("??/*")
        if len(p.name) == 32 and p.is_file()
    )


def floor_receive(
    host: str, port: int, blocks: list[tuple[str, int]], out: Path, direct: bool = False
) -> None:
    """The minimal receiver: one connection to a hub's bulk port, 16 blocks a request,
    each received into one reused buffer, verified (xxh3-128) and written to a new file
    (with ``direct``, by ``O_DIRECT`` as the spoke writes blocks fetched ahead of readers:
    :func:`spoke.cache.staging.write_block_file`).

    Raises:
        ValueError: a block failed verification or the hub refused a request.
    """
    out.mkdir(parents=True, exist_ok=True)
    buf = mmap.mmap(-1, max(size for _, size in blocks))  # page-aligned, as O_DIRECT needs
    view = memoryview(buf)
    writes = DirectWrites() if direct else None
    head = bytearray(bulk.BLOCK_HEAD.size)
    with socket.create_connection((host, port)) as sock:
        for start in range(0, len(blocks), 16):
            part = blocks[start : start + 16]
            sock.sendall(bulk.encode_request("", [d for d, _ in part]))
            for digest, size in part:
                _fill(sock, memoryview(head))
                code, got, length = bulk.parse_block_head(head)
                if code != bulk.OK or got != digest or length != size:
                    raise ValueError(f"hub answered {code} for {digest}")
                _fill(sock, view[:size])
                if xxhash.xxh3_128_hexdigest(view[:size]) != digest:
                    raise ValueError(f"block {digest} failed verification")
                if writes is not None:
                    write_block_file(str(out / digest), view[:size], writes)
                    continue
                fd = os.open(out / digest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    os.write(fd, view[:size])
                finally:
                    os.close(fd)


def _fill(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            raise ValueError("connection closed")
        got += n


def read_files(root: Path, threads: int) -> int:
    """Reads every file under ``root`` once, ``threads`` threads (files dealt round-robin),
    1 MiB reads; bytes."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return read_groups([files[k::threads] for k in range(threads)], MiB)


def run_path(work: Path, shape: Shape, path: str, files: int) -> Row:
    """One run of ``path`` on the published data set under ``work/hub``.

    Raises:
        deploy.local.StackError: the hub or spoke failed to start.
        httpx.HTTPError: the admin API failed.
        RuntimeError: the prewarm did not finish, or the floor receiver failed.
    """
    cache, mnt = work / f"cache-{path}", work / f"mnt-{path}"
    bulk_file = work / "hub" / "bulk.port"
    hub_tls, spoke_tls = tls_flags(work / "pki") if path.endswith("-tls") else ((), ())
    with LocalStack() as stack:
        hub = stack.start_hub(
            work / "hub",
            extra=("--bulk-port", "0", "--bulk-port-file", str(bulk_file), *hub_tls),
        )
        assert stack.hub is not None
        bulk_port = bulk_file.read_text().strip()
        drop_caches()
        if path.startswith("floor"):
            blocks = blob_digests(work / "hub")
            hub0 = tree_cpu_seconds(stack.hub.pid)
            t0 = time.perf_counter()
            out = work / "floor"
            proc = _floor_child(
                hub.rpartition(":")[0], int(bulk_port), blocks, out, path == "floor-direct"
            )
            seconds = time.perf_counter() - t0
            row = Row(
                shape.name,
                path,
                sum(s for _, s in blocks),
                files,
                seconds,
                tree_cpu_seconds(stack.hub.pid) - hub0,
                0.0,
                0.0,
                proc,
            )
            shutil.rmtree(out)
            return row
        extra: list[str] = list(spoke_tls)
        if path in ("bulk1", "bulk2", "cold-bulk", "bulk2-tls"):
            workers = "1" if path == "bulk1" else "2"
            extra += ["--hub-bulk-port", bulk_port, "--fetch-workers", workers]
        cold = path.startswith("cold")
        if cold:
            extra += ["--background-fill", "off"]
        admin = stack.start_spoke(
            hub, cache, mnt, str(2 * GiB + 4 * shape.file_bytes * files), extra=tuple(extra)
        )
        assert stack.spoke is not None
        cpu0 = tree_cpu_seconds(stack.hub.pid), spoke_cpu(stack.spoke.pid)
        self0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        if cold:
            nbytes = read_files(mnt / "bench" / "latest", shape.readers)
            seconds = time.perf_counter() - t0
        else:  # from the POST to the job's end, as the job measured it
            nbytes, seconds = _prewarm(admin, cache)
        self1 = resource.getrusage(resource.RUSAGE_SELF)
        hub1, (daemon1, mount1) = tree_cpu_seconds(stack.hub.pid), spoke_cpu(stack.spoke.pid)
        readers = (
            (self1.ru_utime - self0.ru_utime + self1.ru_stime - self0.ru_stime) if cold else 0.0
        )
        row = Row(
            shape.name,
            path,
            nbytes,
            files,
            seconds,
            hub1 - cpu0[0],
            daemon1 - cpu0[1][0],
            mount1 - cpu0[1][1],
            readers,
        )
    shutil.rmtree(cache, ignore_errors=True)
    return row


def tls_flags(directory: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The hub's and the spoke's flags for mutual TLS between them, as a deployment has it
    (one throwaway CA, :mod:`deploy.pki`, made in ``directory`` once)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = LocalCa(directory, "bench-ca")
    hub, spoke = ca.issue("hub"), ca.issue("spoke")
    return (
        ("--tls-cert", str(hub.cert), "--tls-key", str(hub.key), "--client-ca", str(ca.cert)),
        ("--hub-ca", str(ca.cert), "--hub-cert", str(spoke.cert), "--hub-key", str(spoke.key)),
    )


def _prewarm(admin: str, cache: Path) -> tuple[int, float]:
    """Prewarms everything; the bytes done and the job's own seconds."""
    with httpx.Client(base_url=admin, headers=admin_headers(cache), timeout=60) as client:
        reply = client.post("/v1/prewarm", json={"dataset": "bench", "ref": "latest"})
        reply.raise_for_status()
        job = reply.json()
        while job["state"] == "running":
            time.sleep(0.25)  # each poll costs the daemon CPU: few, and the job times itself
            job = client.get(f"/v1/jobs/{job['id']}").json()
    if job["state"] != "done":
        raise RuntimeError(f"prewarm ended {job['state']}: {job.get('error')}")
    return int(job["bytes_done"]), float(job["elapsed_s"])


def _floor_child(
    host: str, port: int, blocks: list[tuple[str, int]], out: Path, direct: bool
) -> float:
    """Runs :func:`floor_receive` in a child process; returns the CPU seconds of the
    receive (not the child's start-up)."""
    spec = out.with_suffix(".json")
    spec.write_text(
        json.dumps(
            {"host": host, "port": port, "blocks": blocks, "out": str(out), "direct": direct}
        )
    )
    subprocess.run([sys.executable, "-m", "bench.ingest", "--floor-spec", str(spec)], check=True)
    cpu_s = float(json.loads(spec.read_text())["cpu_s"])  # the receive alone, not start-up
    spec.unlink()
    return cpu_s


def markdown(rows: list[Row]) -> str:
    """The rows as a markdown table, with each path's MB/s over the floor's."""
    floors = {r.shape: r.mb_s for r in rows if r.path == "floor"}  # the issue's floor
    lines = [
        "| data | path | MiB | MB/s | × floor | CPU-s/GiB hub | daemon | mount | daemon + mount "
        "| readers / receiver |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        floor = floors.get(r.shape)
        ratio = f"{r.mb_s / floor:.2f}" if floor else "–"
        lines.append(
            f"| {SHAPES[r.shape].what} | {r.path} | {r.bytes / MiB:,.0f} | {r.mb_s:,.0f} | "
            f"{ratio} | {r.per_gib(r.hub_cpu_s):.2f} | {r.per_gib(r.daemon_cpu_s):.2f} | "
            f"{r.per_gib(r.mount_cpu_s):.2f} | "
            f"{r.per_gib(r.daemon_cpu_s + r.mount_cpu_s):.2f} | {r.per_gib(r.client_cpu_s):.2f} |"
        )
    small = [r for r in rows if r.shape == "small" and r.path.startswith("cold")]
    for r in small:
        cpu = r.hub_cpu_s + r.daemon_cpu_s + r.mount_cpu_s
        lines.append(
            f"\nsmall files {r.path}: {r.files / r.seconds:,.0f} files/s, "
            f"{cpu / r.files * 1000:.2f} ms of CPU per missed file (hub + daemon + mount)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the shapes and paths, print the table; 0 unless a run failed."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.ingest", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--size", default="1GiB", help="bytes of the large shape (default 1GiB)")
    parser.add_argument(
        "--only",
        default=",".join(SHAPES),
        help=f"shapes to run, comma-separated: {', '.join(SHAPES)} (default: all)",
    )
    parser.add_argument(
        "--paths",
        default=",".join(PATHS),
        help=f"paths to run, comma-separated: {', '.join(PATHS)} (default: all)",
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--floor-spec", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.floor_spec is not None:
        spec = json.loads(args.floor_spec.read_text())
        before = resource.getrusage(resource.RUSAGE_SELF)
        blocks = [(str(d), int(n)) for d, n in spec["blocks"]]
        floor_receive(spec["host"], spec["port"], blocks, Path(spec["out"]), spec["direct"])
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        args.floor_spec.write_text(json.dumps({"cpu_s": cpu}))
        return 0
    size = parse_size(args.size)
    named = [name for name in args.only.split(",") if name]
    wrong = [name for name in named if name not in SHAPES]
    if not named:
        parser.error(f"--only names no shape; choose from {', '.join(SHAPES)}")
    if wrong:
        parser.error(f"unknown shape(s) {', '.join(wrong)}; choose from {', '.join(SHAPES)}")
    shapes = [SHAPES[name] for name in named]
    paths = [p for p in args.paths.split(",") if p]
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        parser.error(f"unknown path(s) {', '.join(unknown)}; choose from {', '.join(PATHS)}")
    rows: list[Row] = []
    print(
        f"page cache dropped before each run: {drop_caches()}; "
        f"cores: {len(os.sched_getaffinity(0))}"
    )
    for shape in shapes:
        with tempfile.TemporaryDirectory(prefix=f"strata-ingest-{shape.name}-") as tmp:
            work = Path(tmp)
            files = make_source(work / "src", shape, int(size * shape.share))
            publish(work / "hub", "bench", work / "src", "--block-size", str(shape.block_bytes))
            shutil.rmtree(work / "src")
            for path in paths:
                row = run_path(work, shape, path, files)
                rows.append(row)
                print(f"{shape.name:6} {path:9} {row.mb_s:8,.0f} MB/s", flush=True)
    print()
    print(markdown(rows))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
