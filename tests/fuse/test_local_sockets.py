"""The daemon's two local sockets admit only its own user and root, through a real mount:
another (non-root) local user is refused on ``daemon.sock`` (by ``SO_PEERCRED``, even with
its modes loosened) and on gRPC's own ``.grpc/sock`` (by the kernel, at its private
directory, whatever the socket's mode), while the mount and root keep working."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from deploy.local import LocalStack
from hub.publish.tree import publish
from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import spoke_pb2_grpc
from spoke.disk.layout import CacheLayout
from tests.integration.hub_support import write_tree
from tests.support import other_user, requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse, pytest.mark.timeout(180)]

PROBE = r"""
import socket, sys
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
    except PermissionError:
        print("EACCES", end=" ")
        continue
    try:  # connected: does anything answer an HTTP/2 preface and a SETTINGS frame?
        s.settimeout(10)
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
        print("ANSWERED" if s.recv(100) else "closed", end=" ")
    except OSError:
        print("closed", end=" ")
"""


def _probe_as(user: pwd.struct_passwd, *paths: Path) -> list[str]:
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    done = subprocess.run(
        [
            "setpriv",
            f"--reuid={user.pw_uid}",
            f"--regid={user.pw_gid}",
            "--clear-groups",
            python,
            "-c",
            PROBE,
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def _root_lists_datasets(path: Path) -> list[str]:
    with grpc.insecure_channel(f"unix:{path}") as channel:
        reply = spoke_pb2_grpc.SpokeLocalStub(channel).ListDatasets(
            hub_pb2.ListDatasetsRequest(), timeout=10
        )
    return [d.name for d in reply.datasets]


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory every user may enter (pytest's own tmp tree is 0700), so only the
    spoke's modes stand between the other user and its sockets."""
    path = Path(tempfile.mkdtemp(prefix="strata-sockets-"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_another_user_is_refused_on_both_sockets_while_the_mount_and_root_work(
    base: Path,
) -> None:
    other = other_user()
    tmp_path = base
    data = tmp_path / "data"
    publish(data, "ds", write_tree(tmp_path / "src", {"a.bin": b"first", "b.bin": b"second"}))
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    layout = CacheLayout(cache)
    with LocalStack() as stack:
        stack.start_spoke(stack.start_hub(data), cache, mnt, "16MiB")
        assert (mnt / "ds" / "v1" / "a.bin").read_bytes() == b"first"
        private = layout.grpc_socket_path.parent
        assert stat.S_IMODE(os.lstat(private).st_mode) == 0o700
        assert os.lstat(private).st_uid == os.geteuid()
        sockets = (layout.socket_path, layout.grpc_socket_path)
        # as the daemon left them: the cache directory itself stops the other user
        assert _probe_as(other, *sockets) == ["EACCES", "EACCES"]
        # someone loosens every mode they can see: the front door closes the connection
        # unanswered (SO_PEERCRED), gRPC's socket stays out of reach behind .grpc/ (0700)
        os.chmod(cache, 0o711)
        for path in sockets:
            os.chmod(path, 0o666)
        try:
            assert _probe_as(other, *sockets) == ["closed", "EACCES"]
        finally:
            os.chmod(cache, 0o700)
            for path in sockets:
                os.chmod(path, 0o600)
        # root (the daemon's own user here) is admitted on both, and the mount still reads
        for path in sockets:
            assert _root_lists_datasets(path) == ["ds"]
        assert (mnt / "ds" / "v1" / "b.bin").read_bytes() == b"second"
    records = (cache / "audit.jsonl").read_text().splitlines()
    assert any(f'"who":"uid {other.pw_uid}' in r and '"outcome":"denied"' in r for r in records)
