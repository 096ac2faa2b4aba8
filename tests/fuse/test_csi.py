"""strata-csi, for real: a hub, a spoke with its kernel mount, and the CSI node plugin as
processes; the tests speak CSI to the plugin's UNIX socket as the kubelet does.

Publish binds one version read-only at the target (bytes identical, writes EROFS), keeps
that version while the tag moves, and is idempotent; unpublish removes the target; bad
requests get INVALID_ARGUMENT, unknown names NOT_FOUND, an occupied target ALREADY_EXISTS,
a spoke that is not mounted UNAVAILABLE.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from csi.mounttable import mounted_at, mounts, unmount
from deploy.local import LocalStack
from deploy.pki import Leaf, LocalCa
from protocol.csi.v1 import csi_pb2, csi_pb2_grpc
from tests.support import eventually, make_tree, publish, requires_fuse, tree_digests

pytestmark = [
    pytest.mark.fuse,
    requires_fuse,
    pytest.mark.skipif(os.geteuid() != 0, reason="mount(2) of a bind needs root"),
    pytest.mark.timeout(240),
]

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


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plugin]:
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


def test_identity_and_node_info(plugin: Plugin) -> None:
    info = plugin.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
    assert info.name == "csi.strata.io" and info.vendor_version
    caps = plugin.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest())
    assert list(caps.capabilities) == []  # no controller: nothing to create or attach
    probe = plugin.identity.Probe(csi_pb2.ProbeRequest())
    assert probe.HasField("ready") and probe.ready.value is True
    assert plugin.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest()).node_id == "node-a"
    node_caps = plugin.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest())
    assert list(node_caps.capabilities) == []  # no staging


def test_probe_command(plugin: Plugin, tmp_path: Path) -> None:
    """``strata-csi probe``, the container's liveness check: 0 when the plugin answers,
    1 with a one-line reason when nothing listens."""
    sock = plugin.state.parent / "csi.sock"
    ok = subprocess.run(
        [sys.executable, "-m", "csi", "probe", f"--endpoint=unix://{sock}", "--ready"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    gone = subprocess.run(
        [sys.executable, "-m", "csi", "probe", f"--endpoint=unix://{tmp_path}/none.sock"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert gone.returncode == 1 and "does not answer" in gone.stderr


def test_publish_binds_the_version_read_only(plugin: Plugin) -> None:
    target = target_of(plugin, "pod-ro")
    plugin.node.NodePublishVolume(request("vol-ro", target, dataset="demo", ref="v1"))
    assert tree_digests(target) == tree_digests(plugin.src["v1"])
    for attempt in (
        lambda: (target / "small.txt").write_text("x"),
        lambda: (target / "new.txt").write_text("x"),
        lambda: (target / "dir").mkdir(),
        lambda: (target / "small.txt").unlink(),
    ):
        with pytest.raises(OSError) as info:
            attempt()
        assert info.value.errno == errno.EROFS
    here = mounted_at(target)
    assert here is not None and {"ro", "nosuid", "nodev"} <= here.options
    assert here.root == "/demo/v1"
    log = (plugin.pods.parent / "csi.log").read_text()
    assert f"published demo@v1 (v1) at {target} for pod ml/trainer-0" in log
    plugin.node.NodeUnpublishVolume(
        csi_pb2.NodeUnpublishVolumeRequest(volume_id="vol-ro", target_path=str(target))
    )
    assert not target.exists() and mounted_at(target) is None
    assert not any(plugin.state.glob("*.json")), "the record outlives the volume"


def test_a_tag_resolves_once_and_publish_is_idempotent(plugin: Plugin) -> None:
    """latest is v2 at publish; after a v3 moves latest, the volume still shows v2, a
    second identical publish is OK and changes nothing, a new volume gets v3, and asking
    the same target for another version is ALREADY_EXISTS."""
    target, other = target_of(plugin, "pod-tag"), target_of(plugin, "pod-late")
    plugin.node.NodePublishVolume(request("vol-tag", target, dataset="demo", ref="latest"))
    assert tree_digests(target) == tree_digests(plugin.src["v2"])
    held = (target / "small.txt").open()  # a reader with a file open for the whole test

    v3 = plugin.hub_dir.parent / "src-v3"
    shutil.copytree(plugin.src["v2"], v3, symlinks=True)
    (v3 / "small.txt").write_text("version three\n")
    assert publish(plugin.hub_dir, "demo", v3, "--block-size", BLOCK) == "v3"
    eventually(lambda: os.readlink(plugin.mount / "demo" / "latest") == "v3", "latest moving to v3")

    plugin.node.NodePublishVolume(request("vol-tag", target, dataset="demo", ref="latest"))
    assert (target / "small.txt").read_text() == "version two\n"
    assert held.read() == "version two\n"
    held.close()
    plugin.node.NodePublishVolume(request("vol-late", other, dataset="demo", ref="latest"))
    assert (other / "small.txt").read_text() == "version three\n"

    code, details = code_of(
        plugin.node.NodePublishVolume, request("vol-tag", target, dataset="demo", ref="v1")
    )
    assert code == grpc.StatusCode.ALREADY_EXISTS and "demo/v2" in details
    assert tree_digests(target) == tree_digests(plugin.src["v2"]), "the refusal changed it"

    for volume, path in (("vol-tag", target), ("vol-late", other)):
        unpublish = csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume, target_path=str(path))
        plugin.node.NodeUnpublishVolume(unpublish)
        assert not path.exists()
        plugin.node.NodeUnpublishVolume(unpublish)  # again: the target is gone, still OK


def test_unpublish_of_a_target_never_published_is_ok(plugin: Plugin) -> None:
    never = target_of(plugin, "pod-never")
    plugin.node.NodeUnpublishVolume(
        csi_pb2.NodeUnpublishVolumeRequest(volume_id="vol-never", target_path=str(never))
    )
    assert not never.exists()


@pytest.mark.parametrize(
    ("message", "code", "says"),
    [
        (request("v", "/x/t", ref="v1"), grpc.StatusCode.INVALID_ARGUMENT, "'dataset' is required"),
        (request("v", "/x/t", dataset="demo"), grpc.StatusCode.INVALID_ARGUMENT, "'ref'"),
        (
            request("v", "/x/t", dataset="../etc", ref="v1"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "no valid name",
        ),
        (
            request("v", "/x/t", dataset="demo", ref="v1", datset="demo"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown volume attributes ['datset']",
        ),
        (
            request("v", "/x/t", readonly=False, dataset="demo", ref="v1"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "read-only",
        ),
        (
            request("", "/x/t", dataset="demo", ref="v1"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "volume_id",
        ),
        (
            request("v", "relative/t", dataset="demo", ref="v1"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "absolute",
        ),
    ],
    ids=["no-dataset", "no-ref", "bad-name", "unknown-key", "read-write", "no-id", "relative"],
)
def test_bad_requests_are_invalid_argument(
    plugin: Plugin, message: csi_pb2.NodePublishVolumeRequest, code: grpc.StatusCode, says: str
) -> None:
    got, details = code_of(plugin.node.NodePublishVolume, message)
    assert (got, says in details) == (code, True), details


def test_block_volumes_and_mount_flags_are_refused(plugin: Plugin) -> None:
    target = target_of(plugin, "pod-block")
    block = request("v", target, dataset="demo", ref="v1")
    block.volume_capability.block.SetInParent()
    assert code_of(plugin.node.NodePublishVolume, block)[0] == grpc.StatusCode.INVALID_ARGUMENT
    flags = request("v", target, dataset="demo", ref="v1")
    flags.volume_capability.mount.mount_flags.append("rw")
    assert code_of(plugin.node.NodePublishVolume, flags)[0] == grpc.StatusCode.INVALID_ARGUMENT
    missing = request("v", target, dataset="demo", ref="v1")
    missing.ClearField("volume_capability")
    got, details = code_of(plugin.node.NodePublishVolume, missing)
    assert got == grpc.StatusCode.INVALID_ARGUMENT and "volume_capability" in details
    assert not target.exists()


def test_unknown_names_are_not_found(plugin: Plugin) -> None:
    target = target_of(plugin, "pod-unknown")
    for dataset, ref, says in (
        ("nosuch", "v1", "dataset 'nosuch' does not exist"),
        ("demo", "v99", "no version or tag 'v99'"),
        ("demo", "nightly", "no version or tag 'nightly'"),
    ):
        got, details = code_of(
            plugin.node.NodePublishVolume, request("v", target, dataset=dataset, ref=ref)
        )
        assert (got, says in details) == (grpc.StatusCode.NOT_FOUND, True), details
        assert not target.exists()


def test_a_target_holding_another_mount_is_refused(plugin: Plugin) -> None:
    target = target_of(plugin, "pod-tmpfs")
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(target)], check=True)
    try:
        got, details = code_of(
            plugin.node.NodePublishVolume, request("v", target, dataset="demo", ref="v1")
        )
        assert got == grpc.StatusCode.ALREADY_EXISTS and "tmpfs" in details
        got, _ = code_of(
            plugin.node.NodeUnpublishVolume,
            csi_pb2.NodeUnpublishVolumeRequest(volume_id="v", target_path=str(target)),
        )
        assert got == grpc.StatusCode.FAILED_PRECONDITION
        assert mounted_at(target) is not None, "unpublish took away a mount it does not own"
    finally:
        unmount(target)


def test_without_the_spoke_mount_it_is_not_ready_and_unavailable(
    plugin: Plugin, tmp_path: Path
) -> None:
    empty = tmp_path / "not-mounted"
    empty.mkdir()
    sock = tmp_path / "idle.sock"
    with plugin_process(tmp_path, empty, name="idle", pods=plugin.pods) as (identity, node, _):
        assert identity.Probe(csi_pb2.ProbeRequest()).ready.value is False
        idle = subprocess.run(
            [sys.executable, "-m", "csi", "probe", "--ready", f"--endpoint=unix://{sock}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert idle.returncode == 1 and "not ready" in idle.stderr
        target = target_of(plugin, "pod-idle")
        got, details = code_of(
            node.NodePublishVolume, request("v", target, dataset="demo", ref="v1")
        )
        assert got == grpc.StatusCode.UNAVAILABLE and "not mounted" in details
        assert not target.exists()


def test_a_restarted_plugin_keeps_what_it_published(plugin: Plugin) -> None:
    """The record of a publish outlives the plugin (its state directory is on the node):
    after a restart, publishing the same volume again is OK and keeps the version the tag
    named at the first publish, although the tag moved meanwhile; unpublish still works."""
    tmp = plugin.pods.parent
    target = target_of(plugin, "pod-restart")
    with plugin_process(tmp, plugin.mount, name="restart") as (_, node, _state):
        node.NodePublishVolume(request("vol-restart", target, dataset="demo", ref="latest"))
    first = os.readlink(plugin.mount / "demo" / "latest")
    before = (target / "small.txt").read_text()
    newer = tmp / "src-after-restart"
    shutil.copytree(plugin.src["v2"], newer, symlinks=True)
    (newer / "small.txt").write_text("published while the plugin was down\n")
    moved = publish(plugin.hub_dir, "demo", newer, "--block-size", BLOCK)
    eventually(lambda: os.readlink(plugin.mount / "demo" / "latest") == moved, "latest moving")
    with plugin_process(tmp, plugin.mount, name="restart") as (_, node, _state):
        node.NodePublishVolume(request("vol-restart", target, dataset="demo", ref="latest"))
        assert (target / "small.txt").read_text() == before
        here = mounted_at(target)
        assert here is not None and here.root == f"/demo/{first}" != f"/demo/{moved}"
        node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id="vol-restart", target_path=str(target))
        )
    assert not target.exists()


def test_a_plugin_rolled_under_eight_readers_fails_none_of_their_reads(plugin: Plugin) -> None:
    """A CSI plugin rollout under readers (issue 44's target: 0 failed reads): eight
    threads hold files of a published volume open and read them round and round while the
    plugin that published it stops and a new one starts on the same socket and state; the
    bind is the kernel's, so no read waits on the plugin. The new plugin publishes the same
    volume again (idempotent) and unpublishes it after the readers stop."""
    tmp = plugin.pods.parent
    target = target_of(plugin, "pod-roll")
    with plugin_process(tmp, plugin.mount, name="roll") as (_, node, _state):
        node.NodePublishVolume(request("vol-roll", target, dataset="demo", ref="v2"))
    files = sorted(p for p in plugin.src["v2"].rglob("*") if p.is_file() and not p.is_symlink())
    want = {p.relative_to(plugin.src["v2"]): p.read_bytes() for p in files}
    stop, errors, reads = threading.Event(), [], [0] * 8

    def read(i: int) -> None:
        names = list(want)
        handles = {
            n: (target / n).open("rb") for n in names[i % len(names) :] + names[: i % len(names)]
        }
        try:
            while not stop.is_set():
                for name, handle in handles.items():
                    handle.seek(0)
                    if handle.read() != want[name]:
                        errors.append(f"reader {i}: wrong bytes in {name}")
                    reads[i] += 1
        except OSError as err:
            errors.append(f"reader {i}: {err}")
        finally:
            for handle in handles.values():
                handle.close()

    readers = [threading.Thread(target=read, args=(i,)) for i in range(8)]
    for thread in readers:
        thread.start()
    try:
        eventually(lambda: min(reads) > 0, "every reader reading")
        before = sum(reads)
        with plugin_process(tmp, plugin.mount, name="roll") as (_, node, _state):
            eventually(lambda: sum(reads) > before + 8 * len(want), "reads through the roll")
            node.NodePublishVolume(request("vol-roll", target, dataset="demo", ref="v2"))
            stop.set()
            for thread in readers:
                thread.join(timeout=30)
            node.NodeUnpublishVolume(
                csi_pb2.NodeUnpublishVolumeRequest(volume_id="vol-roll", target_path=str(target))
            )
    finally:
        stop.set()
    assert errors == [] and min(reads) > 0, errors[:5]
    print(f"plugin roll: {sum(reads)} reads by 8 readers, {len(errors)} failed")
    assert not target.exists()


def _unpublish(plugin: Plugin, volume_id: str, target: Path | str) -> None:
    plugin.node.NodeUnpublishVolume(
        csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(target))
    )


def _below(root: Path) -> list[str]:
    return [m.mountpoint for m in mounts() if m.mountpoint.startswith(f"{root}/")]


def test_targets_outside_the_pods_directory_or_through_a_symlink_are_refused(
    plugin: Plugin,
) -> None:
    """Nothing is mounted and no directory made for a target the kubelet could not have
    given: outside the pods directory, with '..', through a symlinked component, or a
    symlink itself (issue 39: the plugin followed all of them)."""
    elsewhere = plugin.pods.parent / "elsewhere"
    (elsewhere / "volumes" / "kubernetes.io~csi" / "data").mkdir(parents=True, exist_ok=True)
    linked = plugin.pods / "pod-linked"
    linked.mkdir(exist_ok=True)
    with contextlib.suppress(FileExistsError):
        (linked / "volumes").symlink_to(elsewhere / "volumes")
    last = target_of(plugin, "pod-last")
    with contextlib.suppress(FileExistsError):
        last.symlink_to(elsewhere)
    cases = {
        str(elsewhere / "mount"): "not below the kubelet's pods directory",
        f"{plugin.pods}/pod-x/../../elsewhere/mount": "normalised",
        f"{plugin.pods}//pod-x/mount": "normalised",
        str(plugin.pods): "not below",
        str(linked / "volumes" / "kubernetes.io~csi" / "data" / "mount"): "symlink",
        str(last): "symlink",
    }
    for target, says in cases.items():
        got, details = code_of(
            plugin.node.NodePublishVolume, request("v-out", target, dataset="demo", ref="v1")
        )
        assert (got, says in details) == (grpc.StatusCode.INVALID_ARGUMENT, True), details
    assert _below(elsewhere) == [] and _below(linked) == [] and mounted_at(last) is None
    assert not (elsewhere / "mount").exists()
    assert not (elsewhere / "volumes" / "kubernetes.io~csi" / "data" / "mount").exists()
    assert last.is_symlink() and not any(plugin.state.glob("*.json"))


def test_unpublish_never_takes_a_mount_it_did_not_record(plugin: Plugin) -> None:
    """The spoke's own mount (outside the pods directory) and a bind of it that this
    plugin did not make stay mounted (issue 39: both were unmounted)."""
    got, _ = code_of(
        plugin.node.NodeUnpublishVolume,
        csi_pb2.NodeUnpublishVolumeRequest(volume_id="v", target_path=str(plugin.mount)),
    )
    assert got == grpc.StatusCode.INVALID_ARGUMENT
    assert mounted_at(plugin.mount) is not None
    target = target_of(plugin, "pod-foreign-bind")
    target.mkdir()
    subprocess.run(["mount", "--bind", str(plugin.mount / "demo" / "v1"), str(target)], check=True)
    try:
        got, details = code_of(
            plugin.node.NodeUnpublishVolume,
            csi_pb2.NodeUnpublishVolumeRequest(volume_id="v", target_path=str(target)),
        )
        assert got == grpc.StatusCode.FAILED_PRECONDITION and "left alone" in details
        assert mounted_at(target) is not None
    finally:
        unmount(target)


def test_a_non_ascii_target_is_published_and_unpublished(plugin: Plugin) -> None:
    """Its bind is found in the mount table (issue 39: it was misread and leaked)."""
    parent = plugin.pods / "pod-données" / "volumes" / "kubernetes.io~csi" / "données é"
    parent.mkdir(parents=True)
    target = parent / "mount"
    plugin.node.NodePublishVolume(request("vol-utf8", target, dataset="demo", ref="v1"))
    plugin.node.NodePublishVolume(request("vol-utf8", target, dataset="demo", ref="v1"))
    here = mounted_at(target)
    assert here is not None and here.root == "/demo/v1"
    _unpublish(plugin, "vol-utf8", target)
    assert mounted_at(target) is None and not target.exists()


def test_a_pod_mounts_only_what_its_namespace_may(plugin: Plugin) -> None:
    """Decided from what the kubelet vouches for (the pod's namespace and service
    account), never from the volume's attributes alone; deny by default (issue 39: a pod
    of tenant-b published team-a's dataset)."""
    target = target_of(plugin, "pod-tenant-b")
    denied = request("vol-b", target, dataset="demo", ref="v1", **{POD_NAMESPACE: "tenant-b"})
    got, details = code_of(plugin.node.NodePublishVolume, denied)
    assert got == grpc.StatusCode.PERMISSION_DENIED, details
    assert "tenant-b" in details and "'demo'" in details
    assert not target.exists() and mounted_at(target) is None
    own = request("vol-b", target, dataset="other", ref="v1", **{POD_NAMESPACE: "tenant-b"})
    plugin.node.NodePublishVolume(own)
    assert (target / "b.txt").read_text() == "tenant b's\n"
    # the bind exposes that one version: its ".." is the pod's volume directory
    assert os.listdir(target) == ["b.txt"]
    assert os.path.realpath(target / "..") == str(target.parent)
    assert not (target / ".." / "v1").exists() and not (target / ".." / "demo").exists()
    _unpublish(plugin, "vol-b", target)
    # one service account of a namespace, not the others
    trainer = {POD_NAMESPACE: "tenant-c", SERVICE_ACCOUNT: "trainer"}
    plugin.node.NodePublishVolume(request("vol-c", target, dataset="demo", ref="v1", **trainer))
    _unpublish(plugin, "vol-c", target)
    other_account = {POD_NAMESPACE: "tenant-c", SERVICE_ACCOUNT: "default"}
    got, _ = code_of(
        plugin.node.NodePublishVolume,
        request("vol-c", target, dataset="demo", ref="v1", **other_account),
    )
    assert got == grpc.StatusCode.PERMISSION_DENIED
    # no namespace from the kubelet: refused, naming the CSIDriver setting
    anonymous = request("vol-x", target, dataset="demo", ref="v1")
    del anonymous.volume_context[POD_NAMESPACE]
    got, details = code_of(plugin.node.NodePublishVolume, anonymous)
    assert got == grpc.StatusCode.PERMISSION_DENIED and "podInfoOnMount" in details
    records = [json.loads(line) for line in (plugin.state / "audit.jsonl").read_text().splitlines()]
    refused = [r for r in records if r["outcome"] == "denied"]
    assert {r["who"].split()[1].split("/")[0] for r in refused} >= {"tenant-b", "tenant-c"}
    assert any(r["what"] == "publish other@v1" and r["outcome"] == "ok" for r in records)


def test_a_changed_policy_applies_to_the_next_publish(plugin: Plugin) -> None:
    policy = plugin.pods.parent / "csi-tenancy.yaml"
    before = policy.read_text()
    target = target_of(plugin, "pod-policy")
    ask = request("vol-p", target, dataset="demo", ref="v1", **{POD_NAMESPACE: "tenant-d"})
    assert code_of(plugin.node.NodePublishVolume, ask)[0] == grpc.StatusCode.PERMISSION_DENIED
    try:
        policy.write_text(before + "tenant-d: [de*]\n")
        plugin.node.NodePublishVolume(ask)
        _unpublish(plugin, "vol-p", target)
        policy.write_text("tenant-d: [not a list\n")  # broken: the last good one stays
        plugin.node.NodePublishVolume(ask)
        _unpublish(plugin, "vol-p", target)
    finally:
        policy.write_text(before)
    assert code_of(plugin.node.NodePublishVolume, ask)[0] == grpc.StatusCode.PERMISSION_DENIED


def test_a_volumes_own_token_is_checked_against_the_hubs_scope(plugin: Plugin) -> None:
    """A volume whose secret carries a hub token is published when the hub lets that token
    read the dataset, whatever the namespace's policy, and refused when it does not (a
    token of another dataset, an unknown one); without --hub a token cannot be checked."""
    from hub.serve.config import ServerConfig
    from hub.serve.serverthread import ServerThread

    tmp = plugin.pods.parent
    tokens = tmp / "hub-tokens.yaml"
    tokens.write_text('"token-of-demo-0123456789": [demo]\n"token-of-other-0123456789": [other]\n')
    tokens.chmod(0o600)
    config = ServerConfig(tokens=tokens, insecure=True)
    target = target_of(plugin, "pod-secret")
    outsider = {POD_NAMESPACE: "tenant-z"}  # no tenancy entry names it
    ask = request("vol-s", target, dataset="demo", ref="v1", **outsider)
    ask.secrets["token"] = "token-of-demo-0123456789"
    got, details = code_of(plugin.node.NodePublishVolume, ask)
    assert got == grpc.StatusCode.PERMISSION_DENIED and "--hub" in details
    with ServerThread(plugin.hub_dir, config=config) as hub:
        extra = ("--hub", f"127.0.0.1:{hub.port}", "--hub-insecure")
        with plugin_process(tmp, plugin.mount, "secret", plugin.pods, extra) as (_, node, _s):
            node.NodePublishVolume(ask)
            assert tree_digests(target) == tree_digests(plugin.src["v1"])
            node.NodeUnpublishVolume(
                csi_pb2.NodeUnpublishVolumeRequest(volume_id="vol-s", target_path=str(target))
            )
            for token, says in (
                ("token-of-other-0123456789", "may not read"),
                ("not-a-token-at-all-0123456", "may not read"),
            ):
                ask.secrets["token"] = token
                got, details = code_of(node.NodePublishVolume, ask)
                assert got == grpc.StatusCode.PERMISSION_DENIED and says in details, details
                assert not target.exists()


@pytest.fixture(scope="module")
def pki(plugin: Plugin) -> dict[str, Leaf]:
    """The hub's CA, its server certificate, a client certificate of that CA (the spoke's,
    which the DaemonSet gives the plugin too) and one of a foreign CA."""
    directory = plugin.pods.parent / "pki"
    directory.mkdir()
    ca, foreign = LocalCa(directory, "hub-ca"), LocalCa(directory, "x")
    return {
        "ca": ca.pem,
        "server": ca.issue("hub-server"),
        "client": ca.issue("spoke-client"),
        "foreign": foreign.issue("intruder"),
    }


def test_a_volumes_own_token_against_a_hub_that_requires_client_certificates(
    plugin: Plugin, pki: dict[str, Leaf]
) -> None:
    """Against the hub as shipped (TLS, client certificates from its CA, tokens), a plugin
    with the spoke's certificate publishes a volume whose token covers the dataset and
    refuses one whose token does not (PERMISSION_DENIED); without a client certificate, or
    with a foreign one, the publish fails FAILED_PRECONDITION with one line that names
    the flags to fix, and the plugin said so in its log at start."""
    from hub.serve.config import ServerConfig
    from hub.serve.serverthread import ServerThread

    tmp = plugin.pods.parent
    tokens = tmp / "mtls-tokens.yaml"
    tokens.write_text('"token-of-demo-0123456789": [demo]\n"token-of-other-0123456789": [other]\n')
    tokens.chmod(0o600)
    config = ServerConfig(
        tokens=tokens,
        tls_cert=pki["server"].cert,
        tls_key=pki["server"].key,
        client_ca=pki["ca"].cert,
    )
    target = target_of(plugin, "pod-mtls")
    ask = request("vol-m", target, dataset="demo", ref="v1", **{POD_NAMESPACE: "tenant-z"})
    with ServerThread(plugin.hub_dir, config=config) as hub:
        tls = ("--hub", f"127.0.0.1:{hub.port}", "--hub-ca", str(pki["ca"].cert))
        tls += ("--hub-server-name", "localhost")
        client = ("--hub-cert", str(pki["client"].cert), "--hub-key", str(pki["client"].key))
        with plugin_process(tmp, plugin.mount, "mtls", plugin.pods, (*tls, *client)) as (
            _,
            node,
            _s,
        ):
            ask.secrets["token"] = "token-of-demo-0123456789"
            node.NodePublishVolume(ask)
            assert tree_digests(target) == tree_digests(plugin.src["v1"])
            node.NodeUnpublishVolume(
                csi_pb2.NodeUnpublishVolumeRequest(volume_id="vol-m", target_path=str(target))
            )
            ask.secrets["token"] = "token-of-other-0123456789"
            got, details = code_of(node.NodePublishVolume, ask)
            assert got == grpc.StatusCode.PERMISSION_DENIED and "may not read" in details
            assert not target.exists()
        assert "answers (TLS: with client certificate)" in (tmp / "mtls.log").read_text()

        ask.secrets["token"] = "token-of-demo-0123456789"
        foreign = ("--hub-cert", str(pki["foreign"].cert), "--hub-key", str(pki["foreign"].key))
        for name, extra, says in (
            ("mtls-none", (), "requires a client certificate and this plugin presents none"),
            ("mtls-foreign", foreign, "refused this plugin's client certificate"),
        ):
            with plugin_process(tmp, plugin.mount, name, plugin.pods, (*tls, *extra)) as (
                _,
                node,
                _s,
            ):
                got, details = code_of(node.NodePublishVolume, ask)
                assert got == grpc.StatusCode.FAILED_PRECONDITION, (got, details)
                assert says in details and "\n" not in details, details
                if not extra:
                    assert "--hub-cert and --hub-key" in details
                assert not target.exists()
                log = tmp / f"{name}.log"
                eventually(lambda log=log: "cannot be checked" in log.read_text(), "greet")
                (line,) = [x for x in log.read_text().splitlines() if "cannot be checked" in x]
                assert says in line


def test_hub_without_tls_needs_hub_insecure(tmp_path: Path) -> None:
    """A plugin told to ask a hub in plaintext refuses to start without --hub-insecure: it
    would send volumes' tokens in clear; and the TLS files are checked at start."""
    base = [sys.executable, "-m", "csi", "serve", "--endpoint", f"unix://{tmp_path}/s.sock"]
    base += ["--node-id", "n", "--state-dir", str(tmp_path / "state"), "--pods-dir", "/tmp"]
    for extra, says in (
        (["--hub", "127.0.0.1:1"], "--hub-insecure"),
        (["--hub", "127.0.0.1:1", "--hub-ca", str(tmp_path / "nope.crt")], "--hub-ca"),
        (["--hub", "127.0.0.1:1", "--hub-ca", "/etc/hostname", "--hub-cert", "/x"], "together"),
    ):
        done = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert says in done.stderr, done.stderr


def test_a_bind_that_cannot_be_made_read_only_is_taken_back(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """In-process over the same spoke mount: when the remount fails after the bind, the
    bind is detached through the target's descriptor and the directory removed."""
    from csi import volumes as volumes_module
    from csi.targets import Targets

    def refuse(source: Path, bound: Path) -> None:
        raise OSError(errno.EPERM, "remount refused (test)", str(bound))

    monkeypatch.setattr(volumes_module, "make_read_only", refuse)
    volumes = volumes_module.Volumes(plugin.mount, tmp_path / "state", Targets(plugin.pods))
    target = target_of(plugin, "pod-remount")
    with pytest.raises(volumes_module.VolumeError, match="remount refused"):
        volumes.publish("vol-r", str(target), "demo", "v1")
    assert mounted_at(target) is None and not target.exists()


def test_only_the_kubelets_target_shape_and_an_empty_directory_are_published(
    plugin: Plugin,
) -> None:
    """A pod's own directory, its ``volumes/``, another plugin's volume or a path deeper
    than ``.../kubernetes.io~csi/NAME/mount`` is INVALID_ARGUMENT for publish and unpublish
    alike; a target that is a non-empty directory is FAILED_PRECONDITION; nothing is
    mounted, made or removed (issue 39: a bind over ``pods/pod-y4`` hid its ``volumes/``
    and ``etc-hosts``, and unpublish then failed ``Directory not empty``)."""
    pod = plugin.pods / "pod-y4"
    (pod / "volumes" / "kubernetes.io~csi" / "data").mkdir(parents=True, exist_ok=True)
    (pod / "volumes" / "kubernetes.io~secret" / "token").mkdir(parents=True, exist_ok=True)
    (pod / "etc-hosts").write_text("127.0.0.1 localhost\n")
    empty = plugin.pods / "pod-empty"
    empty.mkdir(exist_ok=True)
    csi_dir = pod / "volumes" / "kubernetes.io~csi"
    for target in (
        pod,
        empty,
        pod / "volumes",
        csi_dir / "data",
        pod / "volumes" / "kubernetes.io~secret" / "token" / "mount",
        csi_dir / "data" / "mount" / "deeper",
        pod / "mount",
    ):
        got, details = code_of(
            plugin.node.NodePublishVolume, request("v-shape", target, dataset="demo", ref="v1")
        )
        assert got == grpc.StatusCode.INVALID_ARGUMENT, (target, got, details)
        assert "kubernetes.io~csi/NAME/mount" in details and "\n" not in details, details
        got, details = code_of(
            plugin.node.NodeUnpublishVolume,
            csi_pb2.NodeUnpublishVolumeRequest(volume_id="v-shape", target_path=str(target)),
        )
        assert got == grpc.StatusCode.INVALID_ARGUMENT, (target, got, details)
    assert _below(pod) == [] and _below(empty) == [] and empty.is_dir()
    assert sorted(os.listdir(pod)) == ["etc-hosts", "volumes"]
    assert not (csi_dir / "data" / "mount").exists() and not (pod / "mount").exists()

    full = target_of(plugin, "pod-full")
    full.mkdir()
    (full / "kept.txt").write_text("the pod's own\n")
    got, details = code_of(
        plugin.node.NodePublishVolume, request("v-full", full, dataset="demo", ref="v1")
    )
    assert got == grpc.StatusCode.FAILED_PRECONDITION and "something in it" in details, details
    assert mounted_at(full) is None and os.listdir(full) == ["kept.txt"]
    assert not any(plugin.state.glob("*.json"))
    # an empty target directory (as older kubelets make it) is published, and taken back
    made = target_of(plugin, "pod-made")
    made.mkdir()
    plugin.node.NodePublishVolume(request("v-made", made, dataset="demo", ref="v1"))
    assert tree_digests(made) == tree_digests(plugin.src["v1"])
    _unpublish(plugin, "v-made", made)
    assert mounted_at(made) is None and not made.exists()


def test_another_volume_id_on_a_published_target_is_already_exists(plugin: Plugin) -> None:
    """The same dataset and ref under a second volume id is ALREADY_EXISTS and the record
    stays the first id's, so its unpublish still works (CSI spec, NodePublishVolume; issue
    39: it was OK, the owner silently became the second id and the first one's unpublish
    failed); the first id again stays OK."""
    target = target_of(plugin, "pod-owner")
    plugin.node.NodePublishVolume(request("vb1", target, dataset="demo", ref="v1"))
    got, details = code_of(
        plugin.node.NodePublishVolume, request("vb2", target, dataset="demo", ref="v1")
    )
    assert got == grpc.StatusCode.ALREADY_EXISTS and "volume vb1" in details, details
    plugin.node.NodePublishVolume(request("vb1", target, dataset="demo", ref="v1"))
    got, details = code_of(
        plugin.node.NodeUnpublishVolume,
        csi_pb2.NodeUnpublishVolumeRequest(volume_id="vb2", target_path=str(target)),
    )
    assert got == grpc.StatusCode.INVALID_ARGUMENT and "holds volume vb1" in details, details
    here = mounted_at(target)
    assert here is not None and here.root == "/demo/v1"
    _unpublish(plugin, "vb1", target)
    assert mounted_at(target) is None and not target.exists()
    assert not any(plugin.state.glob("*.json"))


def test_a_target_that_vanishes_during_publish_is_not_a_missing_snapshot(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """In-process over the same spoke mount: the target is removed between being made and
    being bound (a component swapped meanwhile). The snapshot is still in the spoke's mount,
    so the publish says the target changed (INVALID_ARGUMENT), not NOT_FOUND 'gone from the
    spoke (revoked?)' (issue 39); nothing is mounted or recorded."""
    from csi import volumes as volumes_module
    from csi.targets import Targets

    made = volumes_module._make_dir

    def make_then_lose(parent: int, name: str) -> bool:
        result = made(parent, name)
        os.rmdir(name, dir_fd=parent)  # what the race's other side does
        return result

    monkeypatch.setattr(volumes_module, "_make_dir", make_then_lose)
    volumes = volumes_module.Volumes(plugin.mount, tmp_path / "state", Targets(plugin.pods))
    target = target_of(plugin, "pod-vanish")
    with pytest.raises(volumes_module.InvalidVolume, match="changed while it was being published"):
        volumes.publish("vol-v", str(target), "demo", "v1")
    assert mounted_at(target) is None and not target.exists()
    assert not any((tmp_path / "state").glob("*.json"))
    monkeypatch.undo()
    # a version that is really gone is still NOT_FOUND
    volumes = volumes_module.Volumes(plugin.mount, tmp_path / "state", Targets(plugin.pods))
    with pytest.raises(volumes_module.NoSuchSnapshot):
        volumes.publish("vol-v", str(target), "demo", "v99")


def test_a_component_swapped_during_publish_is_refused_never_not_found(plugin: Plugin) -> None:
    """Over the socket, while another thread swaps the pod's ``volumes`` directory for a
    symlink to a look-alike tree elsewhere and back: every publish is OK (at the real
    target) or INVALID_ARGUMENT, never NOT_FOUND (issue 39), and nothing is mounted
    elsewhere."""
    import threading
    import time

    pod = plugin.pods / "pod-race"
    elsewhere = plugin.pods.parent / "race-elsewhere"
    names = [f"d{i}" for i in range(200)]
    for root in (pod, elsewhere):
        for name in names:
            (root / "volumes" / "kubernetes.io~csi" / name).mkdir(parents=True, exist_ok=True)
    volumes, away = pod / "volumes", pod / "volumes.away"
    stop = threading.Event()
    swaps = 0

    def swap() -> None:
        nonlocal swaps
        while not stop.is_set():
            volumes.rename(away)
            volumes.symlink_to(elsewhere / "volumes")
            volumes.unlink()
            away.rename(volumes)
            swaps += 1

    swapper = threading.Thread(target=swap)
    swapper.start()
    outcomes: dict[str, tuple[grpc.StatusCode, str]] = {}
    try:
        deadline = time.monotonic() + 20
        for name in names:
            if time.monotonic() > deadline:
                break
            target = volumes / "kubernetes.io~csi" / name / "mount"
            try:
                plugin.node.NodePublishVolume(
                    request(f"vol-{name}", target, dataset="demo", ref="v1")
                )
                outcomes[name] = (grpc.StatusCode.OK, "")
            except grpc.RpcError as err:
                outcomes[name] = (err.code(), err.details())  # type: ignore[attr-defined]
    finally:
        stop.set()
        swapper.join()
    assert swaps > 0
    assert _below(elsewhere) == []
    codes = {code for code, _ in outcomes.values()}
    assert codes <= {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}, outcomes
    for name, (code, _) in outcomes.items():
        target = volumes / "kubernetes.io~csi" / name / "mount"
        if code == grpc.StatusCode.OK:
            here = mounted_at(target)
            assert here is not None and here.root == "/demo/v1", name
        _unpublish(plugin, f"vol-{name}", target)
        assert mounted_at(target) is None and not target.exists(), name
    assert _below(pod) == []
