"""strata-csi's targets (issue 39): only the kubelet's own target shape below its pods
directory, never through a symlink, outside it or over something already there; unpublish
takes only the binds it recorded; a target swapped or removed while it is published is
refused as a changed target, never as a missing snapshot; a non-ASCII target is found in
the mount table; a bind that cannot be made read-only is taken back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path

import grpc
import pytest

from csi.mounttable import mounted_at, unmount
from protocol.csi.v1 import csi_pb2
from tests.fuse.csi_support import (
    MARKS,
    Plugin,
    below,
    code_of,
    plugin_fixture,  # noqa: F401  (the plugin fixture)
    request,
    target_of,
    unpublish,
)
from tests.support import tree_digests

pytestmark = MARKS


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
    assert below(elsewhere) == [] and below(linked) == [] and mounted_at(last) is None
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
    unpublish(plugin, "vol-utf8", target)
    assert mounted_at(target) is None and not target.exists()


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
    assert below(pod) == [] and below(empty) == [] and empty.is_dir()
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
    unpublish(plugin, "v-made", made)
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
    unpublish(plugin, "vb1", target)
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
    assert below(elsewhere) == []
    codes = {code for code, _ in outcomes.values()}
    assert codes <= {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}, outcomes
    for name, (code, _) in outcomes.items():
        target = volumes / "kubernetes.io~csi" / name / "mount"
        if code == grpc.StatusCode.OK:
            here = mounted_at(target)
            assert here is not None and here.root == "/demo/v1", name
        unpublish(plugin, f"vol-{name}", target)
        assert mounted_at(target) is None and not target.exists(), name
    assert below(pod) == []
