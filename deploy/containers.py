"""Running the image as the Kubernetes manifests run it, with podman on the host network:
a hub container publishing and serving a tree, and a privileged spoke container whose FUSE
mount reaches the host through an rshared volume (the DaemonSet's ``/mnt/strata``).

Shared by the image tests (``tests/deploy/test_image.py``) and the container benchmark
(:mod:`bench.container_read`). Needs root, podman, runc and ``/dev/fuse``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from deploy.image import ulimit_args
from deploy.local import free_port

HUB_UID = 10001
"""The image's user (``strata``), which owns the hub's data directory as ``fsGroup`` would."""


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``podman ARGS``, output captured as text; never raises on a non-zero exit."""
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def running(name: str) -> bool:
    """Whether container ``name`` is running."""
    state = podman("inspect", "--format", "{{.State.Running}}", name)
    return state.stdout.strip() == "true"


def wait_until(cond: Callable[[], bool], name: str, what: str, timeout: float = 120.0) -> None:
    """Polls ``cond`` every 0.25 s until it holds.

    Raises:
        AssertionError: container ``name`` exited first, or ``timeout`` seconds passed.
    """
    deadline = time.monotonic() + timeout
    while not cond():
        assert running(name), f"container {name} exited before {what}"
        assert time.monotonic() < deadline, f"{what}: not after {timeout:.0f} s"
        time.sleep(0.25)


@contextlib.contextmanager
def container(name: str, image: str, *args: str, command: list[str]) -> Iterator[str]:
    """``podman run -d`` on the host network; stopped (SIGTERM, 20 s) and removed after,
    its log's tail printed."""
    podman("rm", "-f", name)
    started = podman(
        "run", "-d", "--name", name, "--network=host", *ulimit_args(), *args, image, *command
    )
    assert started.returncode == 0, started.stderr
    try:
        yield name
    finally:
        podman("stop", "-t", "20", name, timeout=60)
        logs = podman("logs", name).stderr
        podman("rm", "-f", name)
        print(f"--- {name} ---\n{logs[-3000:]}")


@contextlib.contextmanager
def shared_mount(path: Path) -> Iterator[Path]:
    """``path`` bind-mounted on itself and made shared, as a node's /mnt/strata is: the
    spoke's rshared volume needs a shared mount on the host side. A FUSE mount left at
    ``path/data`` by a spoke that did not stop cleanly is detached first."""
    path.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        subprocess.run(["mount", "--make-shared", str(path)], check=True)
        yield path
    finally:
        if os.path.ismount(path / "data"):
            subprocess.run(["umount", "--lazy", str(path / "data")], check=False)
        subprocess.run(["umount", "--lazy", str(path)], check=True)


@contextlib.contextmanager
def hub_serving(
    image: str, work: Path, src: Path, name: str, block_size: int = 65_536
) -> Iterator[int]:
    """``src`` published as ``demo`` v1 (``block_size`` blocks) by a hub container, then
    served by one on 127.0.0.1 (host network); yields its port.

    Raises:
        AssertionError: the publish failed, or the hub did not listen within 120 s.
    """
    hub_dir = work / "hub"
    hub_dir.mkdir()
    os.chown(hub_dir, HUB_UID, HUB_UID)  # the image's user, as fsGroup does in Kubernetes
    hub_volume = f"{hub_dir}:/var/lib/strata/hub"
    published = podman(
        "run", "--rm", "--network=host", *ulimit_args(), "-v", hub_volume,
        "-v", f"{src}:/src:ro", image,
        "strata-hub", "publish", "--data-dir=/var/lib/strata/hub", f"--block-size={block_size}",
        "demo", "/src",
        timeout=600,
    )  # fmt: skip
    assert published.returncode == 0 and published.stdout.strip() == "v1", published.stderr
    hub_port = free_port()
    hub_command = [
        "strata-hub", "serve", "--data-dir=/var/lib/strata/hub",
        f"--listen=127.0.0.1:{hub_port}", "--port-file=/var/lib/strata/hub/port",
    ]  # fmt: skip
    with container(f"{name}-hub", image, "-v", hub_volume, command=hub_command) as hub:
        wait_until(lambda: (hub_dir / "port").exists(), hub, "the hub listens")
        yield hub_port


def spoke_args(cache: Path, root: Path) -> tuple[str, ...]:
    """How the DaemonSet runs the spoke: privileged, root, /dev/fuse, ``root`` (a shared
    mount) as /mnt/strata with rshared propagation, and --pid=host (the DaemonSet's
    hostPID, which the preStop drain needs; here also: the pid files name host pids)."""
    return (
        "--privileged", "--user=0", "--device=/dev/fuse", "--pid=host",
        "-v", f"{cache}:/var/lib/strata/cache", "-v", f"{root}:/mnt/strata:rshared",
    )  # fmt: skip


def spoke_command(
    hub_port: int, admin_port: int, *extra: str, cache_size: str = "64MiB"
) -> list[str]:
    """``strata-spoke run`` against the hub on ``hub_port``, mounted at
    /mnt/strata/data with ``--allow-other``, admin API on ``admin_port``."""
    return [
        "strata-spoke", "run", f"--hub=127.0.0.1:{hub_port}",
        "--cache-dir=/var/lib/strata/cache", f"--cache-size={cache_size}",
        "--mount=/mnt/strata/data", f"--admin=127.0.0.1:{admin_port}", "--allow-other",
        *extra,
    ]  # fmt: skip
