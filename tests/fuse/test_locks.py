"""File locks on the mount never conflict: one reader cannot block another (the thirteenth
probe). The patched pyfuse3 answers the kernel's lock requests itself and grants each one
(native/pyfuse3-passthrough.patch); left to the kernel, locks were kept per inode and shared
by every process that opens the file, so a reader holding ``flock(LOCK_EX)`` made the
``flock(LOCK_SH | LOCK_NB)`` of HDF5, h5py and netCDF4 opens fail and a blocking one wait.

Skipped where pyfuse3 lacks the lock handlers (a venv not made by ``make``); under CI
(``$CI`` set) that fails instead, since ``make`` builds it there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fusemount.lockcheck import library_grants_locks
from spoke.disk.layout import CacheLayout
from spoke.run.processes import read_pid
from tests.support import new_pid, publish, requires_fuse, supervised_stack

pytestmark = [pytest.mark.fuse, requires_fuse]

# the system's interpreter, which any user may run (the venv's may be private to root): the
# scripts below need only the standard library
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable

# struct flock on Linux x86-64/arm64: l_type, l_whence, l_start, l_len, l_pid (+ padding)
FLOCK = "hhqqi4x"

# The attacker, as another local user: an exclusive flock, a POSIX read lock and an OFD read
# lock over the whole file, each on its own read-only descriptor, held until stdin closes.
ATTACKER = f"""
import fcntl, os, struct, sys
fds = [os.open(sys.argv[1], os.O_RDONLY) for _ in range(3)]
whole = struct.pack({FLOCK!r}, fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0)
fcntl.flock(fds[0], fcntl.LOCK_EX)
fcntl.fcntl(fds[1], fcntl.F_SETLKW, whole)
fcntl.fcntl(fds[2], fcntl.F_OFD_SETLKW, whole)
print("held", flush=True)
sys.stdin.read()
"""

# The victim, another process: what an HDF5 open takes and what a careful reader asks,
# each bounded by a 5 s alarm ("blocked"); then the bytes. Prints one JSON object.
VICTIM = f"""
import errno, fcntl, hashlib, json, os, signal, struct, sys
path, out = sys.argv[1], {{}}
def alarm(*_):
    raise TimeoutError
signal.signal(signal.SIGALRM, alarm)
def attempt(name, call):
    signal.setitimer(signal.ITIMER_REAL, 5)
    try:
        call()
        out[name] = "granted"
    except TimeoutError:
        out[name] = "blocked"
    except OSError as err:
        out[name] = errno.errorcode.get(err.errno, str(err.errno))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
def lock_type(fd, cmd, kind):
    asked = struct.pack({FLOCK!r}, kind, os.SEEK_SET, 0, 0, 0)
    return struct.unpack({FLOCK!r}, fcntl.fcntl(fd, cmd, asked))[0]
fd = os.open(path, os.O_RDONLY)
attempt("flock LOCK_SH|LOCK_NB", lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB))
fcntl.flock(fd, fcntl.LOCK_UN)
attempt("flock LOCK_EX|LOCK_NB", lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
fcntl.flock(fd, fcntl.LOCK_UN)
attempt("flock LOCK_SH", lambda: fcntl.flock(fd, fcntl.LOCK_SH))
fcntl.flock(fd, fcntl.LOCK_UN)
attempt("F_SETLKW F_RDLCK", lambda: lock_type(fd, fcntl.F_SETLKW, fcntl.F_RDLCK))
unlocked = lock_type(fd, fcntl.F_GETLK, fcntl.F_WRLCK) == fcntl.F_UNLCK
out["F_GETLK F_WRLCK"] = "no conflict" if unlocked else "conflict"
ofd = os.open(path, os.O_RDONLY)
unlocked = lock_type(ofd, fcntl.F_OFD_GETLK, fcntl.F_WRLCK) == fcntl.F_UNLCK
out["F_OFD_GETLK F_WRLCK"] = "no conflict" if unlocked else "conflict"
with open(path, "rb") as f:
    out["sha256"] = hashlib.sha256(f.read()).hexdigest()
print(json.dumps(out))
"""


@pytest.fixture
def work() -> Iterator[Path]:
    """A directory every user can traverse (pytest's tmp_path is private to root)."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser to act as another user")
    if not library_grants_locks():
        reason = "pyfuse3 was built without the lock handlers (make setup builds them)"
        if os.environ.get("CI"):
            pytest.fail(reason)  # make builds the library on CI: never pass by skipping
        pytest.skip(reason)
    path = Path(tempfile.mkdtemp(prefix="strata-locks-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("handed_over", [False, True])
def test_a_reader_holding_every_kind_of_lock_blocks_no_other_reader(
    work: Path, handed_over: bool
) -> None:
    """``handed_over``: the mount process is SIGKILLed while the attacker holds its locks;
    the victim asks the successor, which resumed the connection's FUSE_INIT and must
    answer lock requests as the first process did (libfuse would say ENOSYS without
    the handlers, the kernel still asking)."""
    src = work / "src"
    src.mkdir()
    data = os.urandom(300_000)
    (src / "cube.h5").write_bytes(data)
    assert publish(work / "hub", "ds", src) == "v1"
    with supervised_stack(work) as stack:
        hub = stack.start_hub(work / "hub")
        extra = ("--allow-other", "--readable-by-all")
        stack.start_spoke(hub, work / "cache", work / "mnt", "64MiB", extra=extra)
        target = work / "mnt" / "ds" / "v1" / "cube.h5"
        attacker = subprocess.Popen(
            ["runuser", "-u", "nobody", "--", PYTHON, "-c", ATTACKER, str(target)],
            cwd="/",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert attacker.stdout is not None
            held = attacker.stdout.readline()
            assert held == "held\n", attacker.communicate(timeout=10)
            if handed_over:
                layout = CacheLayout(work / "cache")
                mount = read_pid(layout.mount_pid_file)
                assert mount is not None
                os.kill(mount, signal.SIGKILL)
                new_pid(layout.mount_pid_file, mount, "a successor")
            victim = subprocess.run(
                [sys.executable, "-c", VICTIM, str(target)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert victim.returncode == 0, victim.stderr
            seen = json.loads(victim.stdout)
        finally:
            attacker.communicate(timeout=10)  # closes stdin: the attacker lets go, exits
        assert attacker.returncode == 0, attacker.stderr
    assert seen == {
        "flock LOCK_SH|LOCK_NB": "granted",
        "flock LOCK_EX|LOCK_NB": "granted",
        "flock LOCK_SH": "granted",
        "F_SETLKW F_RDLCK": "granted",
        "F_GETLK F_WRLCK": "no conflict",
        "F_OFD_GETLK F_WRLCK": "no conflict",
        "sha256": hashlib.sha256(data).hexdigest(),
    }
