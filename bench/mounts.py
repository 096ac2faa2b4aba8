"""The remote file systems under test, each behind the same emulated WAN link.

* :class:`StrataMount`: a spoke (daemon + FUSE mount) whose ``--hub`` is the WAN proxy in
  front of the hub;
* :class:`RcloneMount`: ``rclone mount`` of the HTTP source with ``--vfs-cache-mode full``;
* :class:`HttpdirfsMount`: ``httpdirfs --cache`` of the HTTP source.

Each is a context manager that starts with an empty cache directory and, on exit (also on
an error or Ctrl-C), detaches the mount (``fusermount3 -u -z``) and stops its process:
SIGTERM, then SIGKILL of its process group.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType

from deploy.local import LocalStack, stop_process
from spoke.disk.mountinfo import is_mounted, lazy_unmount, resolve_mountpoint


class MountError(RuntimeError):
    """A mount did not come up; the message says why (and where its log is)."""


def tool_version(tool: str) -> str:
    """The version number ``TOOL --version`` reports (``""`` when the tool is missing).

    Tools print their version on stdout or stderr, among other lines (httpdirfs also
    prints fusermount's); the number is taken from the first line naming the tool.
    """
    if shutil.which(tool) is None:
        return ""
    proc = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30)
    lines = (proc.stderr + "\n" + proc.stdout).strip().splitlines()
    named = [line for line in lines if tool.lower() in line.lower()] or lines
    match = re.search(r"\d+(?:\.\d+)+[\w.+-]*", named[0]) if named else None
    return match.group(0) if match else (named[0] if named else "")


def _fresh_dir(path: Path) -> Path:
    if is_mounted(path):
        lazy_unmount(path)
    path = resolve_mountpoint(path)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


class _ProcessMount:
    """A FUSE file system served by one foreground process."""

    name = "mount"

    def __init__(self, mount: Path, cache_dir: Path, log: Path) -> None:
        self.mount = mount
        self.cache_dir = cache_dir
        self.log = log
        self._proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The command line that serves the mount in the foreground."""
        raise NotImplementedError

    def __enter__(self) -> _ProcessMount:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, timeout: float = 60.0) -> None:
        """Empty the cache directory, start the process, wait for the mount.

        Raises:
            MountError: The process exited or the mount did not appear in time.
        """
        self.mount = _fresh_dir(self.mount)
        _fresh_dir(self.cache_dir)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self._proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while not os.path.ismount(self.mount):
            if self._proc.poll() is not None:
                raise MountError(f"{self.name} exited with {self._proc.returncode}; see {self.log}")
            if time.monotonic() > deadline:
                self.stop()
                raise MountError(f"{self.name} not mounted after {timeout:.0f} s; see {self.log}")
            time.sleep(0.05)

    @property
    def pid(self) -> int | None:
        """Process id of the file system's process (``None`` when stopped)."""
        return self._proc.pid if self._proc is not None else None

    def stop(self) -> None:
        """Detach the mount and stop the process (idempotent)."""
        if is_mounted(self.mount):
            lazy_unmount(self.mount)
        if self._proc is not None:
            stop_process(self._proc, 15.0)
            self._proc = None


class RcloneMount(_ProcessMount):
    """``rclone mount :http:`` with the full VFS cache, read-only.

    ``--dir-cache-time 1h`` keeps listings for the whole run (the data never changes),
    so the warm figures are not charged for re-listing; everything else is rclone's
    default.
    """

    name = "rclone"

    def __init__(self, url: str, mount: Path, cache_dir: Path, log: Path) -> None:
        super().__init__(mount, cache_dir, log)
        self.url = url

    def command(self) -> list[str]:
        """``rclone mount`` in the foreground."""
        config = self.log.with_suffix(".conf")
        config.touch()
        return [
            "rclone",
            "mount",
            ":http:",
            str(self.mount),
            "--http-url",
            self.url,
            "--vfs-cache-mode",
            "full",
            "--cache-dir",
            str(self.cache_dir),
            "--read-only",
            "--dir-cache-time",
            "1h",
            "--config",
            str(config),
            "--log-level",
            "NOTICE",
        ]


class HttpdirfsMount(_ProcessMount):
    """``httpdirfs --cache`` in the foreground, with its defaults otherwise."""

    name = "httpdirfs"

    def __init__(self, url: str, mount: Path, cache_dir: Path, log: Path) -> None:
        super().__init__(mount, cache_dir, log)
        self.url = url

    def command(self) -> list[str]:
        """``httpdirfs -f --cache`` (foreground)."""
        return [
            "httpdirfs",
            "-f",
            "--cache",
            "--cache-location",
            str(self.cache_dir),
            self.url,
            str(self.mount),
        ]


class StrataMount:
    """A spoke with an empty cache whose hub is reached through the WAN proxy.

    Args:
        hub: The hub's address as the spoke should use it (the proxy's ``HOST:PORT``).
        mount: Mountpoint.
        cache_dir: The spoke's cache directory (emptied first).
        cache_size: ``--cache-size``, e.g. ``4GiB``.
        extra: More ``strata-spoke run`` flags (e.g. ``("--background-fill", "auto")``).
    """

    name = "strata"

    def __init__(
        self, hub: str, mount: Path, cache_dir: Path, cache_size: str, extra: tuple[str, ...] = ()
    ) -> None:
        self.extra = extra
        self.hub = hub
        self.mount = mount
        self.cache_dir = cache_dir
        self.cache_size = cache_size
        self.admin = ""
        self._stack: LocalStack | None = None

    def __enter__(self) -> StrataMount:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start ``strata-spoke run`` and wait for its mount.

        Raises:
            deploy.local.StackError: The spoke did not come up.
        """
        self.mount = _fresh_dir(self.mount)
        _fresh_dir(self.cache_dir)
        self._stack = LocalStack()
        try:
            self.admin = self._stack.start_spoke(
                self.hub, self.cache_dir, self.mount, self.cache_size, extra=self.extra
            )
        except BaseException:
            self.stop()
            raise

    @property
    def token_file(self) -> Path:
        """The admin API's token, generated by the spoke at start (``CACHE_DIR/admin.token``)."""
        return self.cache_dir / "admin.token"

    @property
    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header for the admin API (after :meth:`start`)."""
        return {"Authorization": f"Bearer {self.token_file.read_text().strip()}"}

    @property
    def pid(self) -> int | None:
        """Process id of ``strata-spoke run`` (parent of the daemon and the mount)."""
        spoke = self._stack.spoke if self._stack is not None else None
        return spoke.pid if spoke is not None else None

    def stop(self) -> None:
        """Unmount and stop the spoke (idempotent)."""
        if self._stack is not None:
            self._stack.close()
            self._stack = None
