"""The CSI node plugin as the tests of ``tests/fuse/test_csi*.py`` run it: a hub, a spoke
with its kernel mount, and ``strata-csi serve`` as processes (the ``plugin`` fixture; import
``plugin_fixture`` to use it), and the requests the kubelet sends it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from csi.mounttable import mounts
from deploy.local import LocalStack
from protocol.csi.v1 import csi_pb2, csi_pb2_grpc
from tests.support import eventually, make_tree, publish, requires_fuse

MARKS = [
    pytest.mark.fuse,
    requires_fuse,
    pytest.mark.skipif(os.geteuid() != 0, reason="mount(2) of a bind needs root"),
    pytest.mark.timeout(240),
]
"""Every CSI test file's ``pytestmark``."""

BLOCK = "65536"
TENANCY = """\
ml: [demo, nosuch]         # the namespace of most tests' pods
tenant-b: [other]
tenant-c/trainer: [demo]   # one service account of tenant-c only
"""
POD_NAMESPACE = "csi.storage.k8s.io/pod.namespace"
SERVICE_ACCOUNT = "csi.storage.k8s.io/serviceAccount.name"


@dataclass
class Plugin:
    """A running strata-csi and what it serves."""

    identity: csi_pb2_grpc.IdentityStub
    node: csi_pb2_grpc.NodeStub
    mount: Path
    pods: Path  # where targets go (the kubelet's pods directory)
    state: Path
    src: dict[str, Path]  # version -> the tree published as it
    hub_dir: Path


@contextlib.contextmanager
def plugin_process(
    tmp: Path,
    mount: Path,
    name: str = "csi",
    pods: Path | None = None,
    extra: tuple[str, ...] = (),
) -> Iterator[tuple[csi_pb2_grpc.IdentityStub, csi_pb2_grpc.NodeStub, Path]]:
    """``strata-csi serve`` on ``tmp/NAME.sock`` over ``mount``, its log in ``tmp/NAME.log``,
    targets below ``pods`` (``tmp/pods``); stopped (SIGTERM, then SIGKILL) on the way out.
    Yields the two stubs and the state directory."""
    sock, state = tmp / f"{name}.sock", tmp / f"{name}-state"
    tenancy = tmp / f"{name}-tenancy.yaml"
    if not tenancy.exists():
        tenancy.write_text(TENANCY)
    log = (tmp / f"{name}.log").open("a")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "csi", "serve", "--endpoint", f"unix://{sock}"),
            *("--mount", str(mount), "--node-id", "node-a", "--state-dir", str(state)),
            *("--pods-dir", str(pods or tmp / "pods"), "--tenancy", str(tenancy)),
            *extra,
        ],
        start_new_session=True,
        stderr=log,
    )
    log.close()
    channel = grpc.insecure_channel(f"unix:{sock}")
    try:
        eventually(lambda: sock.exists() or proc.poll() is not None, "the plugin's socket")
        assert proc.poll() is None, f"strata-csi exited with {proc.returncode}"
        grpc.channel_ready_future(channel).result(timeout=30)
        yield csi_pb2_grpc.IdentityStub(channel), csi_pb2_grpc.NodeStub(channel), state
    finally:
        channel.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _unmount_under(root: Path) -> None:
    """Detach every mount below ``root`` (what a failed test left published)."""
    for m in reversed(mounts()):
        if m.mountpoint.startswith(f"{root}/"):
            subprocess.run(["umount", "-l", m.mountpoint], check=False)


@pytest.fixture(scope="module", name="plugin")
def plugin_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plugin]:
    """A hub serving ``demo`` (v1, v2) and ``other`` (v1), a spoke mounting it and the plugin
    over that mount, for one test module."""
    tmp = tmp_path_factory.mktemp("csi")
    src = {"v1": tmp / "src-v1", "v2": tmp / "src-v2"}
    make_tree(src["v1"])
    shutil.copytree(src["v1"], src["v2"], symlinks=True)
    (src["v2"] / "small.txt").write_text("version two\n")
    (src["v2"] / "added.txt").write_text("new in v2\n")
    for version, tree in src.items():
        assert publish(tmp / "hub", "demo", tree, "--block-size", BLOCK) == version
    other = tmp / "src-other"
    other.mkdir()
    (other / "b.txt").write_text("tenant b's\n")
    assert publish(tmp / "hub", "other", other) == "v1"
    pods = tmp / "pods"
    pods.mkdir()
    with LocalStack() as stack:
        hub = stack.start_hub(tmp / "hub")
        stack.start_spoke(hub, tmp / "cache", tmp / "mnt", "64MiB")
        try:
            with plugin_process(tmp, tmp / "mnt") as (identity, node, state):
                yield Plugin(identity, node, tmp / "mnt", pods, state, src, tmp / "hub")
        finally:
            _unmount_under(pods)


def request(
    volume_id: str, target: Path | str, readonly: bool = True, **context: str
) -> csi_pb2.NodePublishVolumeRequest:
    """A NodePublishVolume as the kubelet sends it for an ephemeral inline volume."""
    attributes = {
        "csi.storage.k8s.io/ephemeral": "true",
        "csi.storage.k8s.io/pod.name": "trainer-0",
        "csi.storage.k8s.io/pod.namespace": "ml",
    }
    attributes.update(context)
    return csi_pb2.NodePublishVolumeRequest(
        volume_id=volume_id,
        target_path=str(target),
        volume_capability=csi_pb2.VolumeCapability(
            mount=csi_pb2.VolumeCapability.MountVolume(),
            access_mode=csi_pb2.VolumeCapability.AccessMode(
                mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
            ),
        ),
        readonly=readonly,
        volume_context=attributes,
    )


def target_of(plugin: Plugin, name: str) -> Path:
    """A target path as the kubelet makes it: its parent exists, the target does not."""
    parent = plugin.pods / name / "volumes" / "kubernetes.io~csi" / "data"
    parent.mkdir(parents=True, exist_ok=True)
    return parent / "mount"


def code_of(call: object, message: object) -> tuple[grpc.StatusCode, str]:
    """The status code and details of a call that must fail."""
    with pytest.raises(grpc.RpcError) as info:
        call(message)  # type: ignore[operator]
    err = info.value
    return err.code(), err.details()  # type: ignore[attr-defined]


def unpublish(plugin: Plugin, volume_id: str, target: Path | str) -> None:
    """NodeUnpublishVolume of ``target``, which must succeed."""
    plugin.node.NodeUnpublishVolume(
        csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(target))
    )


def below(root: Path) -> list[str]:
    """The mountpoints strictly below ``root``."""
    return [m.mountpoint for m in mounts() if m.mountpoint.startswith(f"{root}/")]
