"""Mount hand-over under readers: the longest read stall, and every error, when the mount
process is SIGKILLed and when the spoke is upgraded in place (SIGHUP), side by side with
``--mount-handover off`` (today's remount).

    python -m bench.handover [--rounds 3] [--json FILE]

One run on 127.0.0.1: a hub with 8 files of 16 blocks (64 KiB) and 64 one-block files; a
spoke (``strata-spoke run``); 8 reader threads each holding one file open with O_DIRECT
(every read reaches the mount) reading its blocks round and round, and one thread opening,
reading and closing the one-block files (passthrough where the kernel allows it), every
byte compared with the source. Rows:

- ``sigkill``: the mount process SIGKILLed ``--rounds`` times, 1 s apart once reads go on;
- ``sighup``: the spoke upgraded in place (SIGHUP) ``--rounds`` times;
- ``sigkill, hand-over off``: the same kill with ``--mount-handover off``: the remount
  ends the readers' open files (ENOTCONN): the errors column shows what hand-over saves.

Printed per row: reads, failed reads (ENOTCONN, EIO, wrong bytes; target 0), the longest
single read (target <= 2 s) and the hand-overs and remounts the spoke counted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import httpx

from deploy.local import LocalStack, admin_headers, publish
from spoke.disk.layout import CacheLayout
from spoke.run.processes import read_pid

BLOCK = 65_536
READERS = 8


class Readers:
    """``READERS`` threads, each holding one big file open (O_DIRECT) and reading its
    blocks round and round, and one opening, reading and closing one-block files; every
    error and wrong byte is kept, and the longest single read."""

    def __init__(self, root: Path, src: Path, block: int) -> None:
        self.block = block
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.reads = 0
        self.longest = 0.0
        self._lock = threading.Lock()
        self.fds = [
            os.open(root / f"big{i}.bin", os.O_RDONLY | os.O_DIRECT) for i in range(READERS)
        ]
        self.threads = [
            threading.Thread(target=self._big, args=(fd, (src / f"big{i}.bin").read_bytes()))
            for i, fd in enumerate(self.fds)
        ]
        chunks = sorted((src / "chunks").iterdir())
        self.threads.append(threading.Thread(target=self._small, args=(root, chunks)))
        for t in self.threads:
            t.start()

    def _note(self, started: float, error: str | None) -> None:
        with self._lock:
            self.reads += 1
            self.longest = max(self.longest, time.monotonic() - started)
            if error:
                self.errors.append(error)

    def _big(self, fd: int, expected: bytes) -> None:
        block, size = 0, self.block
        blocks = -(-len(expected) // size)
        while not self.stop.is_set():
            started, error = time.monotonic(), None
            try:
                if os.pread(fd, size, block * size) != expected[block * size :][:size]:
                    error = f"wrong bytes at block {block}"
            except OSError as err:
                error = f"block {block}: {err}"
            self._note(started, error)
            block = (block + 1) % blocks

    def _small(self, root: Path, chunks: list[Path]) -> None:
        i = 0
        while not self.stop.is_set():
            chunk = chunks[i % len(chunks)]
            started, error = time.monotonic(), None
            try:
                if (root / "chunks" / chunk.name).read_bytes() != chunk.read_bytes():
                    error = f"wrong bytes in {chunk.name}"
            except OSError as err:
                error = f"{chunk.name}: {err}"
            self._note(started, error)
            i += 1

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        for fd in self.fds:
            os.close(fd)


def _metric(cache: Path, name: str) -> float:
    admin = (cache / "admin.url").read_text().strip()
    auth = admin_headers(cache)  # the admin port's /metrics: the node's token
    for line in httpx.get(f"{admin}/metrics", headers=auth, timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return -1.0


def _until(cond: object, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _source(root: Path) -> Path:
    src = root / "src"
    (src / "chunks").mkdir(parents=True)
    for i in range(READERS):
        (src / f"big{i}.bin").write_bytes(os.urandom(16 * BLOCK + 7))
    for i in range(64):
        (src / "chunks" / f"c{i:02d}").write_bytes(os.urandom(BLOCK))
    publish(root / "hub", "ds", src, "--block-size", str(BLOCK))
    return src


def run_case(root: Path, src: Path, how: str, handover: str, rounds: int) -> dict[str, object]:
    """One row: a fresh spoke, the readers, ``rounds`` kills or upgrades."""
    cache, mnt = root / f"cache-{how}-{handover}", root / f"mnt-{how}-{handover}"
    layout = CacheLayout(cache)
    with LocalStack() as stack:
        hub = stack.start_hub(root / "hub")
        stack.start_spoke(hub, cache, mnt, "256MiB", extra=("--mount-handover", handover))
        assert stack.spoke is not None
        readers = Readers(mnt / "ds" / "v1", src, BLOCK)
        try:
            _until(lambda: readers.reads > 200)
            for _ in range(rounds):
                mount, before = read_pid(layout.mount_pid_file), readers.reads
                if how == "sigkill":
                    assert mount is not None
                    os.kill(mount, signal.SIGKILL)
                else:
                    os.kill(stack.spoke.pid, signal.SIGHUP)
                _until(lambda m=mount: read_pid(layout.mount_pid_file) not in (None, m))  # type: ignore[misc]
                _until(lambda b=before: readers.reads > b + 200, timeout=10)
                time.sleep(1)
        finally:
            readers.finish()
        row = {
            "case": how if handover == "auto" else f"{how}, hand-over off",
            "reads": readers.reads,
            "failed": len(readers.errors),
            "first_error": readers.errors[0] if readers.errors else "",
            "longest_read_s": round(readers.longest, 3),
            "handovers": _metric(cache, "strata_spoke_mount_handovers_total"),
            "remounts": _metric(cache, "strata_spoke_mount_restarts_total"),
        }
    return row


def main(argv: list[str] | None = None) -> int:
    """Run the rows and print the table (and ``--json``)."""
    parser = argparse.ArgumentParser(prog="bench.handover", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    ns = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="strata-handover-") as tmp:
        root = Path(tmp)
        src = _source(root)
        for how, handover in (("sigkill", "auto"), ("sighup", "auto"), ("sigkill", "off")):
            rows.append(run_case(root, src, how, handover, ns.rounds))
    print(
        f"{'case':<24} {'reads':>7} {'failed':>6} {'longest s':>9} "
        f"{'hand-overs':>10} {'remounts':>8}"
    )
    for r in rows:
        print(
            f"{r['case']:<24} {r['reads']:>7} {r['failed']:>6} {r['longest_read_s']:>9} "
            f"{r['handovers']:>10.0f} {r['remounts']:>8.0f}"
        )
    print("targets: 0 failed and longest <= 2 s with hand-over")
    if ns.json is not None:
        ns.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
