"""The cache engine through a real mount: integrity, single flight, persistence across
kill -9, a hub that goes away and comes back, and a cache disk that fills up."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deploy.local import LocalStack, admin_headers, drop_page_cache, free_port, stop_process
from spoke.disk.layout import CacheLayout
from tests.support import (
    all_hits_reported,
    eventually,
    eventually_ok,
    new_pid,
    publish,
    requires_fuse,
    sha256,
)

pytestmark = [pytest.mark.fuse, requires_fuse]

BLOCK = 65_536


def _eio(err: Exception) -> bool:
    """Whether ``err`` is the EIO of a miss that met the outage (a read to retry)."""
    return isinstance(err, OSError) and err.errno == errno.EIO


def _metric(where: str | Path, name: str, **labels: str) -> float:
    """Sum of the samples ``name`` with ``labels`` at a metrics URL, or on the admin port of
    the spoke whose cache is ``where`` (a Path), with its node token."""
    if isinstance(where, Path):
        url, headers = f"{_admin(where)}/metrics", admin_headers(where)
    else:
        url, headers = where, {}
    text = httpx.get(url, headers=headers, timeout=5).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


def _admin(cache: Path) -> str:
    return (cache / "admin.url").read_text().strip()


def _stats(cache: Path) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(
        f"{_admin(cache)}/v1/cache", headers=admin_headers(cache), timeout=5
    ).json()
    return stats


def _drop_page_cache() -> None:
    if not drop_page_cache():
        pytest.skip("cannot drop the kernel page cache (not root)")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    for i in range(4):
        (src / "d" / f"f{i}.bin").write_bytes(os.urandom(5 * BLOCK + 123))
    assert publish(tmp_path / "hub", "ds", src, "--block-size", str(BLOCK)) == "v1"
    return src


@pytest.fixture
def stack() -> Iterator[LocalStack]:
    with LocalStack() as s:
        yield s


def test_a_flipped_byte_on_disk_is_caught_and_refetched(
    tmp_path: Path, source: Path, stack: LocalStack
) -> None:
    hub = stack.start_hub(tmp_path / "hub")
    cache = tmp_path / "cache"
    stack.start_spoke(hub, cache, tmp_path / "mnt", "64MiB")
    f0 = tmp_path / "mnt" / "ds" / "v1" / "d" / "f0.bin"
    assert sha256(f0) == sha256(source / "d" / "f0.bin")
    blocks = [p for p in (cache / "blocks").rglob("*") if p.is_file()]
    victim = blocks[0]
    with open(victim, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x01]))
    _drop_page_cache()
    for name in ("f0.bin", "f1.bin", "f2.bin", "f3.bin"):  # whichever file owns the block
        path = tmp_path / "mnt" / "ds" / "v1" / "d" / name
        assert path.read_bytes() == (source / "d" / name).read_bytes()
    assert _metric(cache, "strata_spoke_corrupt_blocks_total") == 1


def test_sixteen_readers_of_one_uncached_block_cost_one_hub_fetch(
    tmp_path: Path, source: Path, stack: LocalStack
) -> None:
    metrics_port = free_port()
    hub = stack.start_hub(tmp_path / "hub", metrics=f"127.0.0.1:{metrics_port}")
    lazy = ("--background-fill", "off")  # the hub's count is this block's fetches alone
    stack.start_spoke(hub, tmp_path / "cache", tmp_path / "mnt", "64MiB", extra=lazy)
    path = tmp_path / "mnt" / "ds" / "v1" / "d" / "f2.bin"
    os.stat(path)  # load the tree first: only block reads below
    hub_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    before = _metric(hub_metrics, "strata_hub_blocks_served_total")
    barrier = threading.Barrier(16)
    results: list[bytes] = []

    def reader() -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            barrier.wait()
            results.append(os.pread(fd, 4096, 3 * BLOCK + 17))  # the same uncached block
        finally:
            os.close(fd)

    threads = [threading.Thread(target=reader) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    expected = (source / "d" / "f2.bin").read_bytes()[3 * BLOCK + 17 : 3 * BLOCK + 17 + 4096]
    assert results == [expected] * 16
    assert _metric(hub_metrics, "strata_hub_blocks_served_total") - before == 1


def test_cache_survives_kill_9_and_serves_with_the_hub_down(
    tmp_path: Path, source: Path, stack: LocalStack
) -> None:
    hub = stack.start_hub(tmp_path / "hub")
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    stack.start_spoke(hub, cache, mnt, "64MiB")
    files = sorted((mnt / "ds" / "v1" / "d").iterdir())
    for f in files:
        f.read_bytes()
    warm = _stats(cache)
    assert warm["blocks"] == 4 * 6

    daemon_pid = int(CacheLayout(cache).daemon_pid_file.read_text())
    os.kill(daemon_pid, signal.SIGKILL)  # the supervisor restarts it; the mount stays up
    new_pid(CacheLayout(cache).daemon_pid_file, daemon_pid, "the daemon restarted")
    after = eventually_ok(
        lambda: _stats(cache),
        "the restarted daemon's stats",
        retry=lambda err: isinstance(err, (OSError, ValueError, httpx.HTTPError)),
    )
    assert after["blocks"] == warm["blocks"] and after["hub_fetch_bytes"] == 0
    _drop_page_cache()
    for f in files:
        assert sha256(f) == sha256(source / "d" / f.name)
    assert _stats(cache)["hub_fetch_bytes"] == 0  # every block was still a hit

    # stop everything, then mount again with no hub at all: the cache serves alone
    assert stack.spoke is not None and stack.hub is not None
    stop_process(stack.spoke)
    stop_process(stack.hub)
    stack.start_spoke(hub, cache, mnt, "64MiB", extra=("--miss-deadline", "2"))
    assert sorted(os.listdir(mnt / "ds")) == ["latest", "v1"]
    for f in files:
        assert sha256(f) == sha256(source / "d" / f.name)


def test_hub_outage_hits_served_misses_eio_then_resume(
    tmp_path: Path, source: Path, stack: LocalStack
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    hub = stack.start_hub(tmp_path / "hub", listen=listen)
    mnt = tmp_path / "mnt"
    # 4 s: room for gRPC's reconnect backoff (up to 2 s) once the hub is back
    # no fill: the blocks not read before the outage stay misses
    flags = ("--miss-deadline", "4", "--background-fill", "off")
    stack.start_spoke(hub, tmp_path / "cache", mnt, "64MiB", extra=flags)
    d = mnt / "ds" / "v1" / "d"
    assert (d / "f0.bin").read_bytes() == (source / "d" / "f0.bin").read_bytes()
    os.stat(d / "f1.bin")

    assert stack.hub is not None
    stop_process(stack.hub)
    _drop_page_cache()
    assert (d / "f0.bin").read_bytes() == (source / "d" / "f0.bin").read_bytes()  # hits
    started = time.monotonic()
    with pytest.raises(OSError) as info:
        (d / "f1.bin").read_bytes()  # a miss: waits for the deadline, then EIO
    assert info.value.errno == errno.EIO
    assert time.monotonic() - started < 30

    stack.start_hub(tmp_path / "hub", listen=listen)  # the hub comes back on its address
    # reads resume by themselves: nothing is restarted. A read that joins the outage's
    # last fetch, or meets gRPC's reconnect backoff (up to 2 s), may still fail once.
    data = eventually_ok((d / "f1.bin").read_bytes, "a read after the hub is back", 20, _eio)
    assert data == (source / "d" / "f1.bin").read_bytes()


def test_cache_dir_on_a_full_tmpfs(
    tmp_path: Path, source: Path, stack: LocalStack, capfd: pytest.CaptureFixture[str]
) -> None:
    """A cache disk too small for the mount's hand-over records: the mount says so to its
    supervisor, which goes on without hand-over at once (it waited 10 s for a connection
    that never came), and reads evict to fit."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    cache = tmp_path / "cache"
    cache.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(cache)], check=True)
    try:
        hub = stack.start_hub(tmp_path / "hub")
        stack.start_spoke(hub, cache, tmp_path / "mnt", "1GiB")
        said, deadline = "", time.monotonic() + 30  # the supervisor hears it after mounting
        while "mount hand-over off: its records cannot be kept in" not in said:
            assert time.monotonic() < deadline, f"the supervisor never heard why: {said[-2000:]}"
            time.sleep(0.1)
            said += capfd.readouterr().err
        for i in range(4):  # 1.3 MB of blocks through a 512 KiB disk
            path = tmp_path / "mnt" / "ds" / "v1" / "d" / f"f{i}.bin"
            assert sha256(path) == sha256(source / "d" / f"f{i}.bin")
        assert _metric(cache, "strata_spoke_evictions_total") > 0
    finally:
        stack.close()
        subprocess.run(["umount", "-l", str(cache)], check=False)


def test_sequential_read_prefetches_ahead(tmp_path: Path, stack: LocalStack) -> None:
    src = tmp_path / "src-seq"
    src.mkdir()
    data = os.urandom(40 * BLOCK + 5)
    (src / "long.bin").write_bytes(data)
    publish(tmp_path / "hub", "seq", src, "--block-size", str(BLOCK))
    hub = stack.start_hub(tmp_path / "hub")
    cache = tmp_path / "cache"
    stack.start_spoke(hub, cache, tmp_path / "mnt", "64MiB")
    with open(tmp_path / "mnt" / "seq" / "v1" / "long.bin", "rb", buffering=0) as f:
        got = b"".join(iter(lambda: f.read(BLOCK // 2), b""))
    assert got == data
    all_hits_reported(  # batched access reports: the prefetch ledger counts use from them
        tmp_path / "mnt", lambda: _metric(cache, "strata_spoke_cache_hits_total")
    )
    issued = _metric(cache, "strata_spoke_prefetch_bytes_total")
    used = _metric(cache, "strata_spoke_prefetch_used_bytes_total")
    assert issued > 10 * BLOCK  # most of the file was fetched ahead of the reader
    assert used > 0 and used <= issued
    assert _metric(cache, "strata_spoke_prefetch_wasted_bytes_total") == 0


def test_cat_of_a_chunk_directory_is_read_ahead_across_files(
    tmp_path: Path, stack: LocalStack
) -> None:
    src = tmp_path / "src-chunks"
    chunks = src / "vol.zarr" / "c" / "0" / "0"
    chunks.mkdir(parents=True)
    files = {str(i): os.urandom(BLOCK - 7 * i) for i in range(48)}  # one block each
    for name, data in files.items():
        (chunks / name).write_bytes(data)
    publish(tmp_path / "hub", "chunks", src, "--block-size", str(BLOCK))
    hub = stack.start_hub(tmp_path / "hub")
    cache = tmp_path / "cache"
    lazy = ("--background-fill", "off")  # the readahead's bytes, not the fill's
    stack.start_spoke(hub, cache, tmp_path / "mnt", "64MiB", extra=lazy)
    mounted = tmp_path / "mnt" / "chunks" / "v1" / "vol.zarr" / "c" / "0" / "0"
    got = subprocess.run(
        "cat *", shell=True, cwd=mounted, capture_output=True, check=True, env={"LC_ALL": "C"}
    ).stdout
    assert got == b"".join(files[name] for name in sorted(files))  # the shell's order
    all_hits_reported(  # batched access reports: the prefetch ledger counts use from them
        tmp_path / "mnt", lambda: _metric(cache, "strata_spoke_cache_hits_total")
    )
    ahead = _metric(cache, "strata_spoke_fetch_bytes_total", **{"class": "readahead"})

    def issued_and_used() -> tuple[float, float]:
        return (
            _metric(cache, "strata_spoke_prefetch_bytes_total"),
            _metric(cache, "strata_spoke_prefetch_used_bytes_total"),
        )

    # the daemon's hit count also counts EnsureBlocks digests already resident, so it can
    # reach the mount's before the last read's report lands: wait for the use itself
    eventually(
        lambda: len(set(issued_and_used())) == 1,
        lambda: "prefetched bytes issued {}, counted used {}".format(*issued_and_used()),
    )
    issued, _ = issued_and_used()
    assert issued > BLOCK * len(files) / 2  # most files arrived before cat asked
    assert _metric(cache, "strata_spoke_prefetch_wasted_bytes_total") == 0
    assert _metric(cache, "strata_spoke_hub_fetch_blocks_total") == len(files)  # once each
    assert ahead > 0


def test_shuffled_epochs_over_a_small_cache_fetch_nothing_ahead(
    tmp_path: Path, stack: LocalStack
) -> None:
    """Every file once per epoch in a shuffled order (what an unhinted training job does),
    twice, over a cache that holds two thirds of the files: no readahead of any kind
    starts (chance neighbours in a shuffle are no walk), so the hub sends no more blocks
    than were read, and every fetch is a miss."""
    src = tmp_path / "src-shuffled"
    (src / "train").mkdir(parents=True)
    files = {f"{i:03d}": os.urandom(BLOCK - 5 * i) for i in range(48)}  # one block each
    for name, data in files.items():
        (src / "train" / name).write_bytes(data)
    publish(tmp_path / "hub", "shuffled", src, "--block-size", str(BLOCK))
    hub = stack.start_hub(tmp_path / "hub")
    cache = tmp_path / "cache"
    stack.start_spoke(hub, cache, tmp_path / "mnt", str(32 * BLOCK))
    mounted = tmp_path / "mnt" / "shuffled" / "v1" / "train"
    rng = random.Random(7)
    reads = 0
    for _ in range(2):
        order = sorted(files)
        rng.shuffle(order)
        for name in order:
            with open(mounted / name, "rb", buffering=0) as f:
                data = f.read()
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # next: the mount
            assert data == files[name]
            reads += 1
    eventually(  # hit reports are batched (0.1 s)
        lambda: (
            _metric(cache, "strata_spoke_cache_hits_total")
            + _metric(cache, "strata_spoke_cache_misses_total")
            >= reads
        ),
        f"the daemon hearing of all {reads} reads",
        10,
    )
    fetched = _metric(cache, "strata_spoke_hub_fetch_blocks_total")
    misses = _metric(cache, "strata_spoke_cache_misses_total")
    assert _metric(cache, "strata_spoke_cache_hits_total") + misses == reads == 96
    assert fetched == misses <= reads  # every block from the hub was a reader's miss
    assert _metric(cache, "strata_spoke_prefetch_source_bytes_total", outcome="requested") == 0
    assert _metric(cache, "strata_spoke_fetch_bytes_total", **{"class": "readahead"}) == 0
    assert _metric(cache, "strata_spoke_prefetch_bytes_total") == 0
    root = tmp_path / "mnt"
    assert os.getxattr(root, "user.strata.crossfile_windows") == b"0"
    assert _metric(cache, "strata_spoke_evictions_total") > 0  # the cache was too small


def test_background_fill_makes_a_snapshot_resident_while_the_reader_idles(
    tmp_path: Path, source: Path, stack: LocalStack
) -> None:
    hub = stack.start_hub(tmp_path / "hub")
    cache = tmp_path / "cache"
    stack.start_spoke(hub, cache, tmp_path / "mnt", "64MiB")  # fill on: the default
    mounted = tmp_path / "mnt" / "ds" / "v1" / "d"
    with open(mounted / "f0.bin", "rb") as f:  # one small read, then nothing
        assert f.read(100) == (source / "d" / "f0.bin").read_bytes()[:100]
    total = sum(p.stat().st_size for p in (source / "d").iterdir())
    fill: dict[str, Any] = eventually(
        lambda: (
            (f := _stats(cache)["fill"])["snapshots"] and f["snapshots"][0]["state"] == "done" and f
        ),
        lambda: f"the fill done: {_stats(cache)['fill']}",
    )
    assert fill["mode"] == "auto"
    [snap] = fill["snapshots"]
    assert snap["snapshot"] == "ds@v1" and snap["state"] == "done", snap
    assert snap["bytes_resident"] == snap["bytes_total"] == total
    assert snap["bytes_remaining"] == 0
    assert _stats(cache)["used_bytes"] == total  # every block, each once
    filled = _metric(cache, "strata_spoke_fill_bytes_total")
    assert filled == _metric(cache, "strata_spoke_fetch_bytes_total", **{"class": "fill"})
    assert filled >= total - 4 * BLOCK  # all but the read and its readahead
    assert _metric(cache, "strata_spoke_fetch_bytes_total") == total  # each block once
    assert _metric(cache, "strata_spoke_fill_remaining_bytes") == 0
    misses = _metric(cache, "strata_spoke_cache_misses_total")
    # the one read fetched its own block(s) on demand — the kernel's first request spans
    # at most two blocks — and nothing else came by demand or readahead: the fill's 20-odd
    # blocks are never misses
    demand = _metric(cache, "strata_spoke_fetch_bytes_total", **{"class": "demand"})
    assert 0 < demand <= 2 * BLOCK
    assert _metric(cache, "strata_spoke_fetch_bytes_total", **{"class": "readahead"}) == 0
    assert filled + demand == total  # every other block came by the fill
    # a miss is a read that waited: besides its demand blocks, a kernel request that came
    # while the fill had that block on the way waits too and counts (1, 2 and 3 seen)
    assert misses <= 4
    for i in range(4):  # and now every byte is a hit
        assert sha256(mounted / f"f{i}.bin") == sha256(source / "d" / f"f{i}.bin")
    assert _metric(cache, "strata_spoke_cache_misses_total") == misses
