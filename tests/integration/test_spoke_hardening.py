"""A spoke daemon started under ``umask 000`` still keeps its cache owner-only; another
local user can neither list nor read the cache nor use the daemon's socket; the admin API
refuses a 100 MB body with 413 without the daemon's memory growing."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from spoke.disk.layout import CacheLayout
from tests.support import other_user


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    layout: CacheLayout
    admin: str

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    @property
    def token(self) -> str:
        return (self.layout.root / "admin.token").read_text().strip()


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    # a parent every user may enter, so only the cache directory's own modes protect it
    base = Path(tempfile.mkdtemp(prefix="strata-harden-"))
    os.chmod(base, 0o755)
    layout = CacheLayout(base / "cache")
    cmd = [sys.executable, "-m", "spoke", "daemon", "--hub", "127.0.0.1:1"]
    cmd += ["--cache-dir", str(layout.root), "--cache-size", "64MiB", "--admin", "127.0.0.1:0"]
    cmd += ["--log-level", "ERROR"]
    proc = subprocess.Popen(cmd, umask=0, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not layout.admin_url_file.exists():
            assert proc.poll() is None, "daemon exited"
            assert time.monotonic() < deadline, "daemon not ready"
            time.sleep(0.05)
        yield Daemon(proc, layout, layout.admin_url_file.read_text().strip())
    finally:
        proc.terminate()
        proc.wait(20)
        shutil.rmtree(base, ignore_errors=True)


def test_modes_are_owner_only_whatever_the_umask(daemon: Daemon) -> None:
    seen = set()
    for dirpath, _dirs, files in os.walk(daemon.layout.root):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o700, dirpath
        for name in files:
            path = Path(dirpath) / name
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            assert mode & 0o077 == 0, f"{path} is {mode:o}"
            seen.add(str(path.relative_to(daemon.layout.root)))
    for expected in ("index/data.mdb", "index/lock.mdb", "admin.token", "daemon.sock"):
        assert expected in seen, expected
    assert stat.S_IMODE(os.stat(daemon.layout.socket_path).st_mode) == 0o600


PROBE = r"""
import os, socket, sys
root = sys.argv[1]
results = []
for what, fn in [
    ("list", lambda: os.listdir(root)),
    ("index", lambda: open(os.path.join(root, "index", "data.mdb"), "rb").read(1)),
    ("token", lambda: open(os.path.join(root, "admin.token")).read()),
    ("socket", lambda: socket.socket(socket.AF_UNIX).connect(os.path.join(root, "daemon.sock"))),
]:
    try:
        fn()
        results.append(what + "=ALLOWED")
    except PermissionError:
        results.append(what + "=EACCES")
print(" ".join(results))
"""


def test_another_user_cannot_read_the_cache_or_use_the_socket(daemon: Daemon) -> None:
    other = other_user()
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    done = subprocess.run(
        [
            "setpriv",
            f"--reuid={other.pw_uid}",
            f"--regid={other.pw_gid}",
            "--clear-groups",
            python,
            "-c",
            PROBE,
            str(daemon.layout.root),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["list=EACCES", "index=EACCES", "token=EACCES", "socket=EACCES"]
    # the owner (here root) still connects
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(daemon.layout.socket_path))


def test_a_100_mb_body_is_refused_and_memory_stays_flat(daemon: Daemon) -> None:
    auth = {"Authorization": f"Bearer {daemon.token}"}
    assert httpx.get(f"{daemon.admin}/v1/cache", headers=auth, timeout=10).status_code == 200
    before = daemon.rss_bytes()
    body = b"[" + b"1," * (50 << 20)  # 100 MiB of a JSON array that never ends
    for headers in (auth, {}):  # with the token, and without one
        try:
            reply = httpx.post(
                f"{daemon.admin}/v1/hints", content=body, headers=headers, timeout=60
            )
        except httpx.HTTPError:
            reply = None  # the daemon may close before all was sent; the status is checked below
        if reply is not None:
            assert reply.status_code == (413 if headers else 401), reply.text
            assert "detail" in reply.json()

    def chunks() -> Iterator[bytes]:
        for _ in range(100):
            yield b" " * (1 << 20)

    reply = httpx.post(f"{daemon.admin}/v1/hints", content=chunks(), headers=auth, timeout=60)
    assert reply.status_code == 413
    grown = daemon.rss_bytes() - before
    print(f"daemon RSS before {before / 2**20:.1f} MiB, growth {grown / 2**20:.1f} MiB")
    assert grown < 50 << 20
    assert daemon.proc.poll() is None


def test_peers_with_another_uid_are_refused_even_if_modes_are_loosened(daemon: Daemon) -> None:
    other = other_user()
    root = daemon.layout.root
    os.chmod(root, 0o711)  # someone loosens the modes: the kernel check must still hold
    os.chmod(daemon.layout.socket_path, 0o666)
    try:
        python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
        # the front door audits a refused peer and closes it as it accepts: whether the
        # preface is sent before or after that, a refused peer reads the close (or a reset)
        probe = (
            "import socket,sys\n"
            "s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
            "try:\n"
            "    s.sendall(b'PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n')\n"
            "    print('closed' if s.recv(100) == b'' else 'ANSWERED')\n"
            "except OSError:\n"
            "    print('closed')\n"
        )
        done = subprocess.run(
            [
                "setpriv",
                f"--reuid={other.pw_uid}",
                f"--regid={other.pw_gid}",
                "--clear-groups",
                python,
                "-c",
                probe,
                str(daemon.layout.socket_path),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            cwd="/",
        )
        assert done.stdout.strip() == "closed", done
    finally:
        os.chmod(root, 0o700)
        os.chmod(daemon.layout.socket_path, 0o600)
    records = (root / "audit.jsonl").read_text().splitlines()
    assert any(f'"who":"uid {other.pw_uid}' in r and '"outcome":"denied"' in r for r in records)


def test_commands_find_the_generated_admin_token(daemon: Daemon) -> None:
    import json

    cmd = [sys.executable, "-m", "spoke", "status", "--cache-dir", str(daemon.layout.root)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["capacity_bytes"] == 64 << 20
    bad = daemon.layout.root.parent / "wrong-token"
    bad.write_text("not-the-token\n")
    for flag in ("--admin-token-file", "--token-file"):  # the old name still works
        done = subprocess.run(
            [*cmd[:4], "--admin", daemon.admin, flag, str(bad)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1
        assert done.stderr.strip() == (
            "strata-spoke: error: admin API /v1/cache: 401 missing or wrong bearer token"
        )


def test_a_daemon_refuses_a_private_socket_dir_that_is_a_link(tmp_path: Path) -> None:
    """Someone who could write the cache dir left ``.grpc`` as a link to a directory others
    may enter: the daemon says so in one line and serves nothing."""
    layout = CacheLayout(tmp_path / "cache")
    layout.root.mkdir(mode=0o700)
    (tmp_path / "open").mkdir(mode=0o777)
    layout.private_dir.symlink_to(tmp_path / "open")
    cmd = [sys.executable, "-m", "spoke", "daemon", "--hub", "127.0.0.1:1"]
    cmd += ["--cache-dir", str(layout.root), "--cache-size", "64MiB", "--admin", "127.0.0.1:0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"strata-spoke: error: daemon: {layout.private_dir} is a symlink: remove it; "
        "the daemon makes it as a private directory"
    )
    assert list((tmp_path / "open").iterdir()) == []  # no socket was bound there
    assert not layout.socket_path.exists()
