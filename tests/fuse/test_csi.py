"""strata-csi, for real: a hub, a spoke with its kernel mount, and the CSI node plugin as
processes; the tests speak CSI to the plugin's UNIX socket as the kubelet does.

Publish binds one version read-only at the target (bytes identical, writes EROFS), keeps
that version while the tag moves, and is idempotent; unpublish removes the target; bad
requests get INVALID_ARGUMENT, unknown names NOT_FOUND, an occupied target ALREADY_EXISTS,
a spoke that is not mounted UNAVAILABLE; a restarted or rolled plugin keeps what it
published. Which targets it accepts is ``test_csi_targets.py``; who may mount what,
``test_csi_scope.py``.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from csi.mounttable import mounted_at, unmount
from protocol.csi.v1 import csi_pb2
from tests.fuse.csi_support import (
    BLOCK,
    MARKS,
    Plugin,
    code_of,
    plugin_fixture,  # noqa: F401  (the plugin fixture)
    plugin_process,
    request,
    target_of,
)
from tests.support import eventually, publish, tree_digests

pytestmark = MARKS


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


def test_a_pod_holds_at_most_its_share_of_volumes(plugin: Plugin) -> None:
    """Issue 39's seventeenth probe: one pod's 2,000 inline volumes made every other pod's
    publish on the node take 54 ms (the mount table is read each time) and their
    unpublish 17 s. A pod holds at most MAX_POD_VOLUMES; beyond, RESOURCE_EXHAUSTED."""
    from csi.volumes import MAX_POD_VOLUMES

    info = plugin.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest())
    assert info.max_volumes_per_node > MAX_POD_VOLUMES

    def target(pod: str, i: int) -> Path:
        parent = plugin.pods / pod / "volumes" / "kubernetes.io~csi" / f"data-{i}"
        parent.mkdir(parents=True, exist_ok=True)
        return parent / "mount"

    published = []
    try:
        for i in range(MAX_POD_VOLUMES):
            plugin.node.NodePublishVolume(
                request(f"vol-many-{i}", target("pod-many", i), dataset="demo", ref="v1")
            )
            published.append((f"vol-many-{i}", target("pod-many", i)))
        extra = request("vol-many-x", target("pod-many", MAX_POD_VOLUMES), dataset="demo", ref="v1")
        code, message = code_of(plugin.node.NodePublishVolume, extra)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "pod-many" in message
        assert mounted_at(target("pod-many", MAX_POD_VOLUMES)) is None
        other = request("vol-other", target("pod-other", 0), dataset="demo", ref="v1")
        plugin.node.NodePublishVolume(other)  # another pod is not held back
        published.append(("vol-other", target("pod-other", 0)))
        first = published.pop(0)
        plugin.node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=first[0], target_path=str(first[1]))
        )
        plugin.node.NodePublishVolume(extra)  # room again
        published.append(("vol-many-x", target("pod-many", MAX_POD_VOLUMES)))
    finally:
        for volume_id, path in published:
            plugin.node.NodeUnpublishVolume(
                csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(path))
            )
