"""deploy/Containerfile, for real: build the image (Debian base from mmdebstrap, podman,
host network) and serve a file from a hub container through a privileged spoke
container whose FUSE mount reaches the host by rshared propagation, bytes identical;
and the image is the measured system (issue 44, item 1): libfuse 3.17 and the patched
pyfuse3, no compiler; in the container a cached one-block file is read by FUSE
passthrough (no read reaches the mount process), and a mount worker SIGKILLed under
readers holding open files is succeeded on the same connection (hand-over): no error.

Slow (minutes for a first build), so it runs only with STRATA_DEPLOY_TESTS=1 (.ci/run
sets it). Needs root, podman, runc, mmdebstrap and /dev/fuse.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tomllib
from pathlib import Path

import httpx
import pytest

from bench.handover import READERS, Readers
from deploy.containers import (
    container,
    hub_serving,
    podman,
    running,
    shared_mount,
    spoke_args,
    spoke_command,
    wait_until,
)
from deploy.image import BASE, base_digest, build, ulimit_args
from deploy.imagerun import REPO
from deploy.local import free_port
from deploy.wheels import LOCKS, PROJECT, normalize, read_locks
from spoke.disk.layout import CacheLayout
from spoke.disk.mountinfo import is_mounted
from spoke.run.processes import read_pid
from spoke.run.supervisor import mount_processes
from tests.support import eventually, make_tree, requires_fuse, spoke_metric, tree_digests

BLOCK = 65_536
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("STRATA_DEPLOY_TESTS") != "1", reason="set STRATA_DEPLOY_TESTS=1"
    ),
    pytest.mark.skipif(
        not all(shutil.which(t) for t in ("podman", "mmdebstrap", "runc")) or os.getuid() != 0,
        reason="needs root, podman, runc and mmdebstrap (Debian packages)",
    ),
    requires_fuse,
]


@pytest.fixture(scope="module")
def image() -> str:
    return build("runtime", "ci", REPO / "build" / "image")


VENV_SEEDS = {"pip", "setuptools"}
"""What ``python3 -m venv`` puts in every venv (Debian's own wheels), besides the lock."""


def test_image_installs_exactly_the_lock_and_says_what_it_is(image: str) -> None:
    """Every package requirements.lock pins is in the image at the lock's version, and
    nothing else is (issue 27: the image held an fsspec/s3fs newer than the lock); the
    OCI labels name the version, the commit, the build time, the source and the base."""
    listed = podman(
        "run", "--rm", "--network=none", *ulimit_args(), image,
        "python3", "-m", "pip", "list", "--format=json",
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    installed = {normalize(p["name"]): p["version"] for p in json.loads(listed.stdout)}
    pins = read_locks([REPO / lock for lock in LOCKS["runtime"]])
    assert {n: v for n, v in installed.items() if n not in {PROJECT, *VENV_SEEDS}} == {
        name: pin.version for name, pin in pins.items()
    }
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert installed[PROJECT] == project["version"]
    inspected = podman("image", "inspect", "--format", "{{json .Labels}}", image)
    labels = json.loads(inspected.stdout)
    oci = "org.opencontainers.image."
    assert labels[oci + "version"] == project["version"]
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert re.fullmatch(f"{head}(-dirty)?", labels[oci + "revision"]), labels
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", labels[oci + "created"]), labels
    assert labels[oci + "source"], labels
    assert labels[oci + "base.name"] == BASE
    assert labels[oci + "base.digest"] == base_digest(BASE)


@pytest.mark.timeout(1800)
def test_hub_and_spoke_containers_serve_files(image: str, tmp_path: Path) -> None:
    src, cache = tmp_path / "src", tmp_path / "cache"
    src.mkdir()
    make_tree(src)
    name = f"strata-test-{os.getpid()}"
    with (
        hub_serving(image, tmp_path, src, name, block_size=BLOCK) as hub_port,
        shared_mount(tmp_path / "root") as root,
    ):
        (root / "data").mkdir()
        admin_port = free_port()
        cache.mkdir()
        command = spoke_command(hub_port, admin_port)
        args = spoke_args(cache, root)
        with container(f"{name}-spoke", image, *args, command=command) as spoke:
            wait_until(lambda: is_mounted(root / "data"), spoke, "the mount reaches the host")
            assert tree_digests(root / "data" / "demo" / "v1") == tree_digests(src)
            assert (root / "data" / "demo" / "latest").resolve().name == "v1"
            ready = httpx.get(f"http://127.0.0.1:{admin_port}/readyz", timeout=10)
            assert ready.status_code == 200, ready.text
            # the preStop hook, inside the image: this process's open file keeps it waiting
            drain = ["exec", spoke, "python3", "-m", "deploy.drain", "--mount=/mnt/strata/data"]
            with open(root / "data" / "demo" / "v1" / "big.bin", "rb") as held:
                held.read(10)
                busy = podman(*drain, "--timeout=0.5", "--interval=0.1")
            assert busy.returncode == 1 and f"pid {os.getpid()} " in busy.stderr, busy.stderr
            idle = podman(*drain, "--timeout=0")
            assert idle.returncode == 0 and "is idle" in idle.stderr, idle.stderr
        assert not is_mounted(root / "data"), "a stopped spoke container unmounts"


NATIVE_CHECK = """
import spoke.disk.handover, fusemount.passthroughcheck, pyfuse3
assert fusemount.passthroughcheck.library_supports(), "pyfuse3 without passthrough"
assert spoke.disk.handover.library_supports(), "pyfuse3 without resume"
print(pyfuse3.__file__)
"""


def test_the_image_carries_libfuse_3_17_and_the_patched_pyfuse3_and_no_compiler(
    image: str,
) -> None:
    """What native/ builds, in the image: pyfuse3 with the passthrough and hand-over calls,
    linked to libfuse >= 3.17 (not Debian 12's 3.14), the sources' hashes beside it, and
    nothing of the build (compiler, meson, headers) left in the runtime."""
    run = ("run", "--rm", "--network=none", *ulimit_args(), image)
    checked = podman(*run, "python3", "-c", NATIVE_CHECK)
    assert checked.returncode == 0, checked.stderr
    module = checked.stdout.strip()
    linked = podman(*run, "ldd", module)
    assert linked.returncode == 0, linked.stderr
    lib = re.search(r"libfuse3\.so\.\S+ => (\S+)", linked.stdout)
    assert lib is not None and lib.group(1).startswith("/opt/strata-native/"), linked.stdout
    real = podman(*run, "readlink", "-f", lib.group(1)).stdout.strip()
    version = re.fullmatch(r".*/libfuse3\.so\.(\d+)\.(\d+)\.\d+", real)
    assert version is not None and (int(version[1]), int(version[2])) >= (3, 17), real
    sources = podman(*run, "cat", "/opt/strata-native/SOURCES").stdout
    assert re.search(r"^[0-9a-f]{64}  fuse3_3\.\d+\S*\.dsc$", sources, re.M), sources
    assert re.search(r"^[0-9a-f]{64}  pyfuse3-\S+\.tar\.gz$", sources, re.M), sources
    tools = "cc gcc c++ meson ninja pkg-config dpkg-source cython"
    found = podman(*run, "sh", "-c", f"for t in {tools}; do command -v $t; done; ls /usr/include")
    assert found.stdout.strip() == "", found.stdout


def _xattr(mnt: Path, name: str) -> str:
    return os.getxattr(mnt, f"user.strata.{name}").decode()


def _mount_reads(mnt: Path) -> int:
    return int(_xattr(mnt, "loop_reads")) + int(_xattr(mnt, "thread_reads"))


def _readers_tree(src: Path) -> None:
    """What ``bench.handover.Readers`` reads: READERS files of 16 blocks and 7 bytes, and 64
    one-block files under ``chunks/`` (passthrough candidates)."""
    (src / "chunks").mkdir(parents=True)
    for i in range(READERS):
        (src / f"big{i}.bin").write_bytes(os.urandom(16 * BLOCK + 7))
    for i in range(64):
        (src / "chunks" / f"c{i:02d}").write_bytes(os.urandom(BLOCK))


WORKERS = 2


@pytest.mark.timeout(1800)
def test_a_spoke_container_reads_by_passthrough_and_hands_its_mount_over(
    image: str, tmp_path: Path
) -> None:
    src, cache = tmp_path / "src", tmp_path / "cache"
    _readers_tree(src)
    name = f"strata-test-pt-{os.getpid()}"
    with (
        hub_serving(image, tmp_path, src, name, block_size=BLOCK) as hub_port,
        shared_mount(tmp_path / "root") as root,
    ):
        (root / "data").mkdir()
        cache.mkdir()
        mnt, args = root / "data", spoke_args(cache, root)
        # one mount process first: the counters the passthrough check reads are its own
        command = spoke_command(hub_port, free_port(), "--mount-workers=1")
        with container(f"{name}-spoke", image, *args, command=command) as spoke:
            wait_until(lambda: is_mounted(mnt), spoke, "the mount reaches the host")
            unchecked = _passthrough_reads(mnt, src)
        assert not is_mounted(mnt), "a stopped spoke container unmounts"
        # then a spoke on the same (warm) cache with WORKERS mount processes
        command = spoke_command(hub_port, free_port(), f"--mount-workers={WORKERS}")
        with container(f"{name}-spoke", image, *args, command=command) as spoke:
            wait_until(lambda: is_mounted(mnt), spoke, "the mount reaches the host")
            assert unchecked or _xattr(mnt, "passthrough") == "on"
            _hand_over_under_readers(mnt, src, cache, spoke)
        assert not is_mounted(mnt), "a stopped spoke container unmounts"
    if unchecked:  # hand-over passed; the kernel decides passthrough, not the image
        pytest.skip(f"passthrough not checked: {unchecked}")


def _passthrough_reads(mnt: Path, src: Path) -> str:
    """The spoke reports passthrough on, and cached one-block files opened again are read
    by the kernel from their block files: bytes identical, not one read reaches a mount
    process (as tests/fuse/test_passthrough.py proves it on the host). Returns why not
    checked ("": checked): a host kernel that does not offer FUSE passthrough."""
    state = _xattr(mnt, "passthrough")
    if state.startswith("off: the kernel"):
        print(f"passthrough not checked: {state}")
        return state
    assert state == "on", state
    v1 = mnt / "demo" / "v1"
    names = [f"chunks/c{i:02d}" for i in range(8)]
    for n in names:  # the first reads fetch and cache the blocks (pyfuse3 path)
        assert (v1 / n).read_bytes() == (src / n).read_bytes()
    opens = int(_xattr(mnt, "passthrough_opens"))
    fds = {n: os.open(v1 / n, os.O_RDONLY) for n in names}
    try:
        assert int(_xattr(mnt, "passthrough_opens")) == opens + len(names)
        reads = _mount_reads(mnt)
        for n, fd in fds.items():
            want = (src / n).read_bytes()
            assert os.pread(fd, BLOCK + 10, 0) == want
            assert os.pread(fd, 4096, 12_345) == want[12_345 : 12_345 + 4096]
        assert _mount_reads(mnt) == reads, "a passthrough read reached the mount"
    finally:
        for fd in fds.values():
            os.close(fd)
    return ""


def _hand_over_under_readers(mnt: Path, src: Path, cache: Path, spoke: str) -> None:
    """WORKERS mount processes serve the connection; the first (the supervisor's mount)
    SIGKILLed under READERS threads holding files open (O_DIRECT: every read reaches a
    mount process) and one opening one-block files (passthrough): a successor resumes the
    connection, every read succeeds with the right bytes, nothing is remounted (as
    tests/fuse/test_handover.py and test_mount_workers.py prove it on the host)."""
    in_container = Path("/mnt/strata/data")  # the mount processes' own path of the mount
    eventually(lambda: len(mount_processes(in_container)) == WORKERS, "the mount workers")
    layout = CacheLayout(cache)
    first = read_pid(layout.mount_pid_file)  # a host pid: the container shares its pids
    assert first is not None and first in mount_processes(in_container), (
        first,
        mount_processes(in_container),
    )
    readers = Readers(mnt / "demo" / "v1", src, BLOCK)
    try:
        eventually(lambda: readers.reads > 200, "reads before the kill")
        before = readers.reads
        os.kill(first, signal.SIGKILL)
        eventually(
            lambda: read_pid(layout.mount_pid_file) not in (None, first),
            "a successor of the killed mount process",
        )
        eventually(lambda: readers.reads > before + 300, "reads after the kill")
        eventually(
            lambda: (
                len(mount_processes(in_container)) == WORKERS
                and first not in mount_processes(in_container)
            ),
            "the workers back to their number",
        )
        eventually(
            lambda: spoke_metric(cache, "strata_spoke_mount_handovers_total") == 1,
            "the hand-over counted",
        )
    finally:
        readers.finish()
    assert readers.errors == [], readers.errors[:10]
    print(f"hand-over in the container: {readers.reads} reads, longest {readers.longest:.3f} s")
    assert readers.longest < 10  # the 2 s target is measured by bench.handover, not here
    assert spoke_metric(cache, "strata_spoke_mount_restarts_total") == 0  # never remounted
    assert running(spoke)
    v1 = mnt / "demo" / "v1"
    assert (v1 / "big0.bin").read_bytes() == (src / "big0.bin").read_bytes()  # a new open
