"""deploy/Containerfile, for real: build the image (Debian base from mmdebstrap, podman,
host network) and serve a file from a hub container through a privileged spoke
container whose FUSE mount reaches the host by rshared propagation, bytes identical.

Slow (minutes for a first build), so it runs only with STRATA_DEPLOY_TESTS=1 (.ci/run
sets it). Needs root, podman, runc, mmdebstrap and /dev/fuse.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.image import (
    BASE,
    LOCKS,
    PROJECT,
    REPO,
    base_digest,
    build,
    normalize,
    read_locks,
    ulimit_args,
)
from deploy.local import free_port
from spoke.disk.mountinfo import is_mounted, lazy_unmount
from tests.support import make_tree, requires_fuse, tree_digests

HUB_UID = 10001
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


def _podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def image() -> str:
    return build("runtime", "ci", REPO / "build" / "image")


VENV_SEEDS = {"pip", "setuptools"}
"""What ``python3 -m venv`` puts in every venv (Debian's own wheels), besides the lock."""


def test_image_installs_exactly_the_lock_and_says_what_it_is(image: str) -> None:
    """Every package requirements.lock pins is in the image at the lock's version, and
    nothing else is (issue 27: the image held an fsspec/s3fs newer than the lock); the
    OCI labels name the version, the commit, the build time, the source and the base."""
    listed = _podman(
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
    inspected = _podman("image", "inspect", "--format", "{{json .Labels}}", image)
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


@contextlib.contextmanager
def container(name: str, image: str, *args: str, command: list[str]) -> Iterator[str]:
    """``podman run -d`` on the host network; stopped (SIGTERM, 20 s) and removed after."""
    _podman("rm", "-f", name)
    started = _podman(
        "run", "-d", "--name", name, "--network=host", *ulimit_args(), *args, image, *command
    )
    assert started.returncode == 0, started.stderr
    try:
        yield name
    finally:
        _podman("stop", "-t", "20", name, timeout=60)
        logs = _podman("logs", name).stderr
        _podman("rm", "-f", name)
        print(f"--- {name} ---\n{logs[-3000:]}")


def _running(name: str) -> bool:
    state = _podman("inspect", "--format", "{{.State.Running}}", name)
    return state.stdout.strip() == "true"


def _wait(cond: object, name: str, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert _running(name), f"container {name} exited before {what}"
        assert time.monotonic() < deadline, f"{what}: not after {timeout:.0f} s"
        time.sleep(0.25)


@contextlib.contextmanager
def shared_mount(path: Path) -> Iterator[Path]:
    """``path`` bind-mounted on itself and made shared, as a node's /mnt/strata is: the
    spoke's rshared volume needs a shared mount on the host side."""
    path.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        subprocess.run(["mount", "--make-shared", str(path)], check=True)
        yield path
    finally:
        if is_mounted(path / "data"):  # a spoke that did not stop cleanly
            lazy_unmount(path / "data")
        subprocess.run(["umount", "--lazy", str(path)], check=True)


@pytest.mark.timeout(1800)
def test_hub_and_spoke_containers_serve_files(image: str, tmp_path: Path) -> None:
    src, hub_dir, cache = tmp_path / "src", tmp_path / "hub", tmp_path / "cache"
    src.mkdir()
    make_tree(src)
    hub_dir.mkdir()
    os.chown(hub_dir, HUB_UID, HUB_UID)  # the image's user, as fsGroup does in Kubernetes
    hub_volume = f"{hub_dir}:/var/lib/strata/hub"
    published = _podman(
        "run", "--rm", "--network=host", *ulimit_args(), "-v", hub_volume,
        "-v", f"{src}:/src:ro", image,
        "strata-hub", "publish", "--data-dir=/var/lib/strata/hub", "--block-size=65536",
        "demo", "/src",
    )  # fmt: skip
    assert published.returncode == 0 and published.stdout.strip() == "v1", published.stderr
    hub_port, admin_port = free_port(), free_port()
    hub_command = [
        "strata-hub", "serve", "--data-dir=/var/lib/strata/hub",
        f"--listen=127.0.0.1:{hub_port}", "--port-file=/var/lib/strata/hub/port",
    ]  # fmt: skip
    name = f"strata-test-{os.getpid()}"
    with (
        container(f"{name}-hub", image, "-v", hub_volume, command=hub_command) as hub,
        shared_mount(tmp_path / "root") as root,
    ):
        _wait(lambda: (hub_dir / "port").exists(), hub, "the hub listens")
        (root / "data").mkdir()
        spoke_command = [
            "strata-spoke", "run", f"--hub=127.0.0.1:{hub_port}",
            "--cache-dir=/var/lib/strata/cache", "--cache-size=64MiB",
            "--mount=/mnt/strata/data", f"--admin=127.0.0.1:{admin_port}", "--allow-other",
        ]  # fmt: skip
        spoke_args = (  # --pid=host: the DaemonSet's hostPID, which the preStop drain needs
            "--privileged", "--user=0", "--device=/dev/fuse", "--pid=host",
            "-v", f"{cache}:/var/lib/strata/cache", "-v", f"{root}:/mnt/strata:rshared",
        )  # fmt: skip
        cache.mkdir()
        with container(f"{name}-spoke", image, *spoke_args, command=spoke_command) as spoke:
            _wait(lambda: is_mounted(root / "data"), spoke, "the mount reaches the host")
            assert tree_digests(root / "data" / "demo" / "v1") == tree_digests(src)
            assert (root / "data" / "demo" / "latest").resolve().name == "v1"
            ready = httpx.get(f"http://127.0.0.1:{admin_port}/readyz", timeout=10)
            assert ready.status_code == 200, ready.text
            # the preStop hook, inside the image: this process's open file keeps it waiting
            drain = ["exec", spoke, "python3", "-m", "deploy.drain", "--mount=/mnt/strata/data"]
            with open(root / "data" / "demo" / "v1" / "big.bin", "rb") as held:
                held.read(10)
                busy = _podman(*drain, "--timeout=0.5", "--interval=0.1")
            assert busy.returncode == 1 and f"pid {os.getpid()} " in busy.stderr, busy.stderr
            idle = _podman(*drain, "--timeout=0")
            assert idle.returncode == 0 and "is idle" in idle.stderr, idle.stderr
        assert not is_mounted(root / "data"), "a stopped spoke container unmounts"
