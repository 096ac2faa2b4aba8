"""A throwaway PostgreSQL server on 127.0.0.1, from Debian's ``postgresql`` package.

For the tests (``tests/pgserver.py``) and the benchmarks (``bench.hub_ha``): ``initdb``
into a directory, ``postgres`` on a free loopback port (TCP, and a UNIX socket only inside
the directory), ``fsync`` off (the data need not survive a power cut), trust
authentication. PostgreSQL refuses to run as root, so under root the cluster belongs to
the ``postgres`` system user the package creates and the server runs as that user
(``setpriv``); its directory must then be reachable by that user (under ``/tmp``, not a
root-only one). Not for production: docs/deploy.md says how to run the catalog's engine.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psycopg


def postgres_bin() -> Path | None:
    """The newest Debian PostgreSQL server's bin directory, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=_major)
    return Path(found[-1]).parent if found else None


def _major(path: str) -> int:
    part = Path(path).parent.parent.name
    return int(part) if part.isdigit() else 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One PostgreSQL server on 127.0.0.1 with trust authentication.

    Args:
        directory: Where the cluster is made (created; removed by :meth:`close`).

    Raises:
        RuntimeError: ``initdb`` or the server failed (its log is in the message).
    """

    def __init__(self, directory: Path) -> None:
        bindir = postgres_bin()
        if bindir is None:
            raise RuntimeError("PostgreSQL is not installed (Debian package postgresql)")
        self.bindir = bindir
        self.directory = directory
        self.data = directory / "pgdata"
        self.log = directory / "postgres.log"
        self.port = _free_port()
        self._names = itertools.count()
        directory.mkdir(parents=True, exist_ok=True)
        self._user: pwd.struct_passwd | None = (
            pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        )
        if self._user is not None:
            os.chown(directory, self._user.pw_uid, self._user.pw_gid)
        self._run(
            str(bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
            "--auth=trust", "-E", "UTF8", "--no-sync",
        )  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def _command(self, *argv: str) -> list[str]:
        if self._user is None:
            return list(argv)
        return [
            "setpriv", f"--reuid={self._user.pw_uid}", f"--regid={self._user.pw_gid}",
            "--init-groups", "--", *argv,
        ]  # fmt: skip

    def _run(self, *argv: str) -> None:
        result = subprocess.run(self._command(*argv), capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {result.stderr.strip()}")

    @property
    def admin_url(self) -> str:
        """A URL of the ``postgres`` database, as the superuser."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        """The URL of ``database``, as the superuser."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self, timeout: float = 30.0) -> None:
        """Starts the server (again, after :meth:`stop`) and waits until it accepts calls.

        Raises:
            RuntimeError: It did not come up within ``timeout`` seconds.
        """
        log = self.log.open("ab")
        self.process = subprocess.Popen(
            self._command(
                str(self.bindir / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={self.directory}",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
                "-c",
                "shared_buffers=32MB",
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.admin_url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"postgres did not start: {self.log.read_text(errors='replace')[-2000:]}"
                    ) from None
                time.sleep(0.1)

    def stop(self, *, kill: bool = False) -> None:
        """Stops the server: a fast shutdown (SIGINT), or SIGKILL of the postmaster."""
        if self.process is None:
            return
        process, self.process = self.process, None
        process.send_signal(signal.SIGKILL if kill else signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if kill:  # the postmaster's children notice its death and exit; wait for the lock
            pid_file = self.data / "postmaster.pid"
            deadline = time.monotonic() + 10
            while pid_file.exists() and time.monotonic() < deadline:
                time.sleep(0.1)

    def database(self) -> str:
        """Creates a fresh database; returns its URL."""
        name = f"strata_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def close(self) -> None:
        """Stops the server and removes its directory."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
