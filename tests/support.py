"""Helpers for tests that run real processes and kernel mounts."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import os
import pwd
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from deploy.local import LocalStack, admin_headers, publish
from spoke.disk.layout import CacheLayout
from spoke.disk.mountinfo import is_mounted, lazy_unmount
from spoke.run.processes import cmdline, read_pid

__all__ = [
    "FileState",
    "all_hits_reported",
    "eventually",
    "eventually_async",
    "eventually_ok",
    "file_states",
    "fuse_available",
    "make_tree",
    "new_pid",
    "other_user",
    "planted_dir",
    "publish",
    "requires_fuse",
    "sha256",
    "spoke_metric",
    "sticky_dir",
    "supervised_stack",
    "tree_digests",
]

T = TypeVar("T")

OTHER_USER = "strata-test-other"
"""A second, non-root local user for tests of what other users may not do."""


def fuse_available() -> str | None:
    """None when kernel FUSE mounts can run here, else the reason they cannot."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian package fuse3)"
    return None


requires_fuse = pytest.mark.skipif(fuse_available() is not None, reason=fuse_available() or "")


def other_user() -> pwd.struct_passwd:
    """The second local user (``useradd``-ed on first use); skips unless root can make it."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to create a second local user")
    try:
        return pwd.getpwnam(OTHER_USER)
    except KeyError:
        made = subprocess.run(
            ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
            capture_output=True,
            text=True,
        )
        try:  # another test worker may have made it first (useradd exits 9: it exists)
            return pwd.getpwnam(OTHER_USER)
        except KeyError:
            raise AssertionError(f"useradd {OTHER_USER} failed: {made.stderr.strip()}") from None


@contextlib.contextmanager
def sticky_dir() -> Iterator[Path]:
    """A fresh root-owned, world-writable, sticky directory directly under ``/tmp`` (as
    ``/tmp`` and ``/dev/shm`` are: others may add entries, only an entry's owner may
    remove it), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="strata-sticky-"))
    os.chmod(path, 0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def traversable_dir(prefix: str, *tools: str) -> Iterator[Path]:
    """A fresh directory under ``/tmp`` every user can traverse (pytest's ``tmp_path`` is
    private to root), for tests that act as another user; skips unless this is root with
    ``tools`` (``runuser``, ``setpriv``, ...) on the PATH. Removed afterwards."""
    if os.geteuid() != 0 or any(shutil.which(tool) is None for tool in tools):
        pytest.skip(f"needs root and {', '.join(tools)} to act as another user")
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def planted_dir(shared: Path, name: str, files: dict[str, bytes]) -> Path:
    """What another local user leaves for a root process to pick up: ``shared/name``
    made by the second user (:func:`other_user`, through ``setpriv``) under umask 0, with
    ``files`` in it (``"index/data.mdb"`` makes ``index/`` too): every directory 0777,
    every file 0666.

    Returns:
        ``shared/name``.
    """
    other = other_user()
    root = shared / name
    script = ["umask 0", f"mkdir -p {shlex.quote(str(root))}"]
    for rel, data in files.items():
        path = root / rel
        script.append(f"mkdir -p {shlex.quote(str(path.parent))}")
        script.append(f"printf %s {shlex.quote(data.decode())} > {shlex.quote(str(path))}")
    subprocess.run(
        [
            "setpriv",
            f"--reuid={other.pw_uid}",
            f"--regid={other.pw_gid}",
            "--clear-groups",
            "sh",
            "-c",
            " && ".join(script),
        ],
        check=True,
        cwd="/",
        timeout=30,
    )
    return root


FileState = tuple[int, int, int, bytes | None]
"""A path's (uid, st_mode, size, bytes for files) as :func:`file_states` records it."""


def file_states(root: Path) -> dict[str, FileState]:
    """Every path under ``root`` (itself as ``.``), ``lstat``-ed, with the bytes of files:
    to show that nothing in it was written, added, removed or changed."""
    out: dict[str, FileState] = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = os.lstat(path)
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        out[str(path.relative_to(root))] = (st.st_uid, st.st_mode, st.st_size, data)
    return out


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def tree_digests(root: Path) -> dict[str, str]:
    """``relative path -> sha256`` of every regular file under ``root`` (symlinks not followed)."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                out[str(p.relative_to(root))] = sha256(p)
    return out


def make_tree(root: Path, seed: int = 0) -> None:
    """A small snapshot source: empty, tiny, multi-block files, nesting and a symlink."""
    import random

    rng = random.Random(seed)
    (root / "nested" / "deeper").mkdir(parents=True)
    (root / "empty-dir").mkdir()
    (root / "empty.bin").write_bytes(b"")
    (root / "one.txt").write_bytes(b"x")
    (root / "small.txt").write_text("hello strata\n")
    (root / "big.bin").write_bytes(rng.randbytes(300_000))  # several 64 KiB blocks
    (root / "nested" / "a.bin").write_bytes(rng.randbytes(65_536))  # exactly one block
    (root / "nested" / "deeper" / "b.bin").write_bytes(rng.randbytes(65_537))
    (root / "link-to-small").symlink_to("small.txt")


def run_module(module: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` from the repository root, output captured (text).

    Raises:
        subprocess.TimeoutExpired: it ran longer than ``timeout`` seconds.
    """
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def eventually(
    predicate: Callable[[], T],
    what: str | Callable[[], str],
    timeout: float = 30.0,
    interval: float = 0.05,
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something true, and
    return that: the one way tests wait for a condition instead of sleeping a fixed time.

    Raises:
        AssertionError: still false after ``timeout`` seconds (the message names ``what``,
            or is what it returns then, and the last value).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(_late(what, timeout, value))
        time.sleep(interval)


def _oserror(err: Exception) -> bool:
    return isinstance(err, OSError)


def eventually_ok(
    op: Callable[[], T],
    what: str,
    timeout: float = 30.0,
    retry: Callable[[Exception], bool] = _oserror,
) -> T:
    """Call ``op`` until it returns instead of raising, and return what it returned: a
    reader that retries (a read through a mount being remounted, a hub coming back). An
    error ``retry`` does not accept (by default: anything but an :class:`OSError`) is
    raised at once.

    Raises:
        AssertionError: still failing after ``timeout`` seconds (the message names
            ``what`` and the last error).
    """
    failed: list[Exception] = []

    def attempt() -> tuple[T] | None:
        try:
            return (op(),)
        except Exception as err:
            if not retry(err):
                raise
            failed[:] = [err]
            return None

    return eventually(attempt, lambda: f"{what} (last error: {failed[-1]!r})", timeout)[0]


def _late(what: str | Callable[[], str], timeout: float, value: object) -> str:
    said = what() if callable(what) else what
    return f"{said}: not within {timeout} s (last: {value!r})"


async def eventually_async(
    predicate: Callable[[], T | Awaitable[T]],
    what: str | Callable[[], str],
    timeout: float = 30.0,
    interval: float = 0.01,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """:func:`eventually` on a running event loop: ``predicate`` (plain or a coroutine
    function) is tried every ``interval`` seconds, the loop running meanwhile (asyncio's;
    ``sleep=trio.sleep`` for trio's)."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        value: T = await got if inspect.isawaitable(got) else got  # type: ignore[assignment]
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(_late(what, timeout, value))
        await sleep(interval)


def all_hits_reported(mnt: Path, daemon_hits: Callable[[], float], timeout: float = 30.0) -> None:
    """Until the daemon has heard of every hit the mount at ``mnt`` gathered so far
    (hits go out in batches, every 0.1 s): ``daemon_hits()`` (its hit count, e.g. from
    ``/v1/cache``) reaches the mount's ``user.strata.hits``."""
    gathered = int(os.getxattr(mnt, "user.strata.hits"))
    eventually(
        lambda: daemon_hits() >= gathered,
        f"the daemon hearing of the mount's {gathered} hits",
        timeout,
    )


def readers_source(tmp_path: Path, block: int, big_files: int) -> Path:
    """``tmp_path/src`` with the files ``bench.handover.Readers`` reads (``big_files`` of
    16 blocks and 7 bytes, 64 one-block files under ``chunks/``), published to
    ``tmp_path/hub`` as ``ds`` v1 with blocks of ``block`` bytes."""
    src = tmp_path / "src"
    (src / "chunks").mkdir(parents=True)
    for i in range(big_files):
        (src / f"big{i}.bin").write_bytes(os.urandom(16 * block + 7))
    for i in range(64):  # one-block files: passthrough where the kernel allows it
        (src / "chunks" / f"c{i:02d}").write_bytes(os.urandom(block))
    assert publish(tmp_path / "hub", "ds", src, "--block-size", str(block)) == "v1"
    return src


@contextlib.contextmanager
def supervised_stack(tmp_path: Path) -> Iterator[LocalStack]:
    """A :class:`LocalStack` whose spoke uses ``tmp_path/cache`` and ``tmp_path/mnt``,
    for tests that kill supervisors: on the way out, whatever the test did, the mount
    and daemon processes left serving that cache (orphans of a killed supervisor) are
    SIGKILLed and the mountpoint is lazily unmounted."""
    with LocalStack() as stack:
        try:
            yield stack
        finally:
            layout = CacheLayout(tmp_path / "cache")
            for pid_file in (layout.mount_pid_file, layout.daemon_pid_file):
                pid = read_pid(pid_file)
                args = cmdline(pid) if pid else None
                if pid and args and str(layout.root) in args:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, 9)
            mnt = (tmp_path / "mnt").resolve()
            if is_mounted(mnt):
                lazy_unmount(mnt)


def spoke_metric(cache: Path, name: str, token_file: Path | None = None) -> float:
    """The value of the unlabelled metric ``name`` on the admin API of the spoke whose
    cache is ``cache`` (its address from ``cache/admin.url``), scraped with the node's
    admin token (``token_file``, or the one it generated: :func:`admin_headers`).

    Raises:
        AssertionError: the metric is not exported.
    """
    admin = (cache / "admin.url").read_text().strip()
    headers = admin_headers(cache, token_file)
    for line in httpx.get(f"{admin}/metrics", headers=headers, timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def new_pid(pid_file: Path, old: int | None, what: str, timeout: float = 30.0) -> int:
    """Wait until ``pid_file`` names a process other than ``old`` (a successor, a
    restarted daemon) and return its pid.

    Raises:
        AssertionError: not within ``timeout`` seconds (the message names ``what``).
    """
    pid = eventually(
        lambda: read_pid(pid_file) not in (None, old) and read_pid(pid_file), what, timeout
    )
    return int(pid)


def client_hello(context: ssl.SSLContext, server_hostname: str = "localhost") -> bytes:
    """A real ClientHello's record from ``context`` (a client's), as its first flight
    sends it: what a flood of whole ClientHellos repeats."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    if not hello:
        raise RuntimeError("the TLS client wrote no ClientHello")
    return hello


def silent_flood(
    port: int,
    stop: threading.Event,
    opened: list[socket.socket],
    per_s: float,
    net: str,
    first: bytes = b"",
) -> None:
    """Opens connections to 127.0.0.1:``port`` that send ``first`` (nothing by default)
    and no more, from ``net``.2 to ``net``.201 in turn (``net`` like ``"127.0.1"``), about
    ``per_s`` a second, until ``stop``; each one that connected is appended to ``opened``
    (the caller closes them)."""
    start, i = time.monotonic(), 0
    while not stop.is_set():
        sock = socket.socket()
        sock.bind((f"{net}.{2 + i % 200}", 0))
        try:
            sock.connect(("127.0.0.1", port))
            if first:
                sock.sendall(first)
        except OSError:
            sock.close()
        else:
            opened.append(sock)
        i += 1
        time.sleep(max(0.0, start + i / per_s - time.monotonic()))
