"""Succession with each spoke in a mount namespace of its own, as two spoke pods on one
node: the node's mount root shared (a systemd host's ``/``), each "pod" a namespace that
takes it ``Bidirectional`` (``--make-rshared``, as the DaemonSet's hostPath), its spoke
started inside it. Readers on the node (training pods reading the hostPath) hold files
open while the new pod's spoke takes over the old pod's FUSE connection, then the old
pod's namespace is torn down (its pod deleted): 0 failed reads, and the node and the new
pod still have the mount. What is left out of a real cluster: the kubelet, the container
runtime and separate network namespaces."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.handover import READERS, Readers
from deploy.local import LocalStack
from spoke.disk.layout import CacheLayout
from spoke.disk.mountinfo import is_mounted, lazy_unmount
from spoke.run.process import stop_process
from tests.support import eventually, readers_source, requires_fuse, spoke_metric

pytestmark = [
    pytest.mark.fuse,
    requires_fuse,
    pytest.mark.skipif(
        os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")),
        reason="needs root, unshare and nsenter",
    ),
]

BLOCK = 65_536


class Pod:
    """A mount namespace (held by a sleeping process) taking ``root`` rshared."""

    def __init__(self, root: Path) -> None:
        self.holder = subprocess.Popen(
            ["unshare", "-m", "--propagation", "unchanged", "sleep", "600"]
        )
        eventually(
            lambda: (
                os.readlink(f"/proc/{self.holder.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
            ),
            "the pod's namespace",
        )
        self.run("mount", "--make-rshared", str(root))

    def run(self, *args: str) -> None:
        subprocess.run(["nsenter", "-t", str(self.holder.pid), "-m", "--", *args], check=True)

    def spawn(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            ["nsenter", "-t", str(self.holder.pid), "-m", "--", *args], start_new_session=True
        )

    def sees(self, path: Path) -> bool:
        done = subprocess.run(
            ["nsenter", "-t", str(self.holder.pid), "-m", "--", "cat", str(path)],
            capture_output=True,
        )
        return done.returncode == 0

    def delete(self) -> None:
        """The pod goes: its namespace with it (the holder was its last process)."""
        self.holder.kill()
        self.holder.wait()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/mnt-strata``, a shared mount on the node (this namespace); unmounted,
    with whatever is below it, afterwards."""
    root = tmp_path / "mnt-strata"
    (root / "data").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
    try:
        subprocess.run(["mount", "--make-shared", str(root)], check=True)
        yield root
    finally:
        if is_mounted(root / "data"):
            lazy_unmount(root / "data")
        subprocess.run(["umount", "-l", str(root)], check=False)


def test_a_new_pods_spoke_takes_over_the_old_pods_mount(tmp_path: Path, node: Path) -> None:
    src = readers_source(tmp_path, BLOCK, READERS)
    mnt, cache = node / "data", tmp_path / "cache"
    layout = CacheLayout(cache)
    pods: list[Pod] = []
    spokes: list[subprocess.Popen[bytes]] = []
    with LocalStack() as stack:
        hub = stack.start_hub(tmp_path / "hub")
        spoke = [sys.executable, "-m", "spoke", "run", "--hub", hub, "--cache-dir", str(cache),
                 "--cache-size", "64MiB", "--mount", str(mnt), "--admin", "127.0.0.1:0",
                 "--log-level", "WARNING", "--take-over"]  # fmt: skip
        readers = None
        try:
            old = Pod(node)
            pods.append(old)
            spokes.append(old.spawn(*spoke))
            eventually(lambda: is_mounted(mnt) and layout.admin_url_file.exists(), "old pod")
            eventually(layout.succession_socket.exists, "the old spoke listening")
            readers = Readers(mnt / "ds" / "v1", src, BLOCK)  # on the node, as a hostPath
            eventually(lambda: readers is not None and readers.reads > 3000, "reads")

            new = Pod(node)  # beside it (maxSurge)
            pods.append(new)
            assert new.sees(mnt / "ds" / "v1" / "big0.bin"), "the old pod's mount"
            before, readers.longest = readers.reads, 0.0
            spokes.append(new.spawn(*spoke))
            assert spokes[0].wait(60) == 0  # taken over: it exits without unmounting
            eventually(lambda: spoke_metric(cache, "strata_spoke_successions_total") == 1,
                       "the succession counted")  # fmt: skip
            old.delete()
            eventually(lambda: readers is not None and readers.reads > before + 400, "reads")
            assert is_mounted(mnt) and new.sees(mnt / "ds" / "v1" / "big1.bin")
            assert spokes[1].poll() is None
        finally:
            if readers is not None:
                readers.finish()
            for proc in reversed(spokes):
                stop_process(proc)
            for pod in pods:
                with contextlib.suppress(ProcessLookupError):
                    pod.delete()
    assert readers is not None
    print(f"succession across pods: {readers.reads} reads, {len(readers.errors)} failed, "
          f"longest {readers.longest:.3f} s")  # fmt: skip
    assert readers.errors == []
    assert readers.longest < 30
