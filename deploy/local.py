"""Run a hub and a spoke (daemon + mount) as local processes, and always clean them up.

Used by ``strata-demo`` and by the kernel-level tests. Every process is started through
``sys.executable -m …`` in its own session, so a Ctrl-C reaches only the caller, which
then stops the spoke (unmount first) and the hub in reverse order of start.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from spoke.disk.mountinfo import is_mounted, lazy_unmount, resolve_mountpoint
from spoke.run.process import stop_process as stop_process  # re-exported: the harness's callers


class StackError(RuntimeError):
    """A process of the local stack failed to start; the message says which and why."""


def _wait_for(cond: object, proc: subprocess.Popen[bytes], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if proc.poll() is not None:
            raise StackError(f"{what} exited with status {proc.returncode} while starting")
        if time.monotonic() > deadline:
            raise StackError(f"{what} not ready after {timeout:.0f} s")
        time.sleep(0.05)


def publish(data_dir: Path, dataset: str, src: Path, *extra: str) -> str:
    """``strata-hub publish`` in a subprocess; returns the new version (e.g. ``v1``).

    Raises:
        StackError: the publish failed (its one-line error is in the message).
    """
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hub",
            "publish",
            "--data-dir",
            str(data_dir),
            dataset,
            str(src),
            *extra,
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise StackError(proc.stderr.strip() or f"publish exited {proc.returncode}")
    return proc.stdout.strip()


def drop_page_cache(level: int = 1) -> bool:
    """``sync``, then drop the kernel's page cache (level 1), dentries and inodes (2), or
    both (3) through /proc/sys/vm/drop_caches (root only; Linux
    Documentation/admin-guide/sysctl/vm.rst).

    Returns:
        True when dropped; False when not allowed (the caller decides what that means).
    """
    os.sync()  # only clean pages can be dropped
    try:
        Path("/proc/sys/vm/drop_caches").write_text(f"{level}\n")
    except OSError:
        return False
    return True


def admin_headers(cache_dir: Path, token_file: Path | None = None) -> dict[str, str]:
    """The ``Authorization`` header for a spoke's admin API: the token of ``token_file``
    (its ``--admin-token-file``) or the one it generated, ``CACHE_DIR/admin.token``.

    Raises:
        OSError: the token file cannot be read (the spoke has not started yet?).
    """
    path = token_file if token_file is not None else cache_dir / "admin.token"
    return {"Authorization": f"Bearer {path.read_text().strip()}"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for restarting on the same port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LocalStack:
    """A context manager owning local hub and spoke processes.

    Example::

        with LocalStack() as stack:
            hub = stack.start_hub(data_dir)
            admin = stack.start_spoke(hub, cache_dir, mountpoint, "1GiB")
    """

    def __init__(self, log_level: str = "WARNING") -> None:
        self.log_level = log_level
        self._procs: list[subprocess.Popen[bytes]] = []
        self._mounts: list[Path] = []
        self.hub: subprocess.Popen[bytes] | None = None  # the latest hub started
        self.spoke: subprocess.Popen[bytes] | None = None  # the latest spoke started

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _spawn(self, args: list[str], open_files: int | None = None) -> subprocess.Popen[bytes]:
        files = open_files or 0

        def limit() -> None:  # in the child, before exec: its processes inherit it
            resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

        proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            start_new_session=True,
            preexec_fn=limit if open_files is not None else None,
        )
        self._procs.append(proc)
        return proc

    def start_hub(
        self,
        data_dir: Path,
        timeout: float = 30.0,
        listen: str = "127.0.0.1:0",
        metrics: str | None = None,
        extra: tuple[str, ...] = (),
    ) -> str:
        """Serve ``data_dir`` on ``listen`` (default: a free port on 127.0.0.1), with
        ``extra`` flags for ``strata-hub serve``.

        Returns:
            The hub's ``HOST:PORT``.
        """
        port_file = data_dir / "hub.port"
        port_file.unlink(missing_ok=True)
        args = ["hub", "serve", "--data-dir", str(data_dir), "--listen", listen]
        args += ["--port-file", str(port_file)]
        if metrics:
            args += ["--metrics", metrics]
        proc = self._spawn([*args, *extra])
        self.hub = proc
        _wait_for(
            lambda: port_file.exists() and port_file.read_text().strip(), proc, "hub", timeout
        )
        return f"{listen.rpartition(':')[0]}:{port_file.read_text().strip()}"

    def start_spoke(
        self,
        hub: str,
        cache_dir: Path,
        mount: Path,
        cache_size: str,
        timeout: float = 60.0,
        extra: tuple[str, ...] = (),
        admin_token: bool = True,
        open_files: int | None = None,
    ) -> str:
        """Run ``strata-spoke run`` and wait until the mount is up; returns the admin URL.

        ``open_files`` sets its processes' open-file limit (soft and hard), as a unit's
        ``LimitNOFILE=`` would.

        The admin API needs the token the spoke generates in ``CACHE_DIR/admin.token``
        (the spoke's default; :func:`admin_headers` sends it), or the one of an
        ``--admin-token-file`` in ``extra``. ``admin_token=False`` runs it open
        (``--no-admin-token``): only for a test that asks for exactly that.
        """
        mount = resolve_mountpoint(mount)  # it may be a dead (ENOTCONN) mount
        with contextlib.suppress(FileExistsError):
            mount.mkdir(parents=True)
        url_file = cache_dir / "admin.url"
        url_file.unlink(missing_ok=True)
        proc = self._spawn(
            [
                "spoke",
                "run",
                "--hub",
                hub,
                "--cache-dir",
                str(cache_dir),
                "--cache-size",
                cache_size,
                "--mount",
                str(mount),
                "--admin",
                "127.0.0.1:0",
                "--log-level",
                self.log_level,
                *(() if admin_token else ("--no-admin-token",)),
                *extra,
            ],
            open_files,
        )
        self._mounts.append(mount)
        self.spoke = proc
        _wait_for(lambda: is_mounted(mount) and url_file.exists(), proc, "spoke", timeout)
        return url_file.read_text().strip()

    def stop_spoke(self) -> None:
        """Stop the latest spoke started (its mount first) and detach its mount."""
        proc, self.spoke = self.spoke, None
        if proc is None:
            return
        stop_process(proc)
        if proc in self._procs:
            self._procs.remove(proc)
        mount = self._mounts.pop() if self._mounts else None
        if mount is not None and is_mounted(mount):
            lazy_unmount(mount)

    def close(self) -> None:
        """Stop every process, newest first, and detach any mount left behind."""
        while self._procs:
            stop_process(self._procs.pop())
        for mount in self._mounts:
            if is_mounted(mount):
                lazy_unmount(mount)
        self._mounts.clear()
