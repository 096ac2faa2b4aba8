"""Succession across pods, the mounts' side, played with Linux mount namespaces as
tests/deploy/test_csi_propagation.py plays the two DaemonSets: the old spoke pod, the new
spoke pod started beside it (maxSurge) and the CSI plugin's pod as namespaces of one
"node" (a private namespace of its own), each taking the node's /mnt/strata with the
propagation the rendered manifests give it. A tmpfs stands in for the FUSE mount
(propagation is the same; the FUSE connection itself lives on in the new spoke, which
holds its descriptor: tests/fuse/test_succession.py).

What it shows: the new pod sees the old pod's mount (so its init container leaves it
alone and its spoke takes it over), and when the old pod's namespace goes without
unmounting — a succeeded spoke's pod deleted — the node, the new pod and the plugin
keep the mount: Linux does not propagate the unmounts of a namespace being torn down.
With the spoke's mode taken as ``None`` instead, the new pod never sees the mount."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy import k8s_support as k8s

pytestmark = k8s.needs_namespaces

# $1 the node's directory; $2 the spoke's mode for /mnt/strata; $3 the plugin's; $4 the
# new spoke pod's init container command, as rendered, with /mnt/strata as $N/mnt-strata
SCRIPT = k8s.pod_play(
    "N=$1; SPOKE_ROOT=$2; CSI_ROOT=$3; INIT=$4",
    r"""mkdir -p "$N/mnt-strata/data"
mount --bind "$N/mnt-strata" "$N/mnt-strata"; mount --make-shared "$N/mnt-strata"

csi=$(pod); pids="$pids $csi"; wait_ns "$csi"
in_pod "$csi" "mount $CSI_ROOT '$N/mnt-strata'"
old=$(pod); pids="$pids $old"; wait_ns "$old"
in_pod "$old" "mount $SPOKE_ROOT '$N/mnt-strata' && mount -t tmpfs spoke '$N/mnt-strata/data' \
    && echo one > '$N/mnt-strata/data/f'"
# the new spoke pod, beside the old one: its init container, then its spoke
new=$(pod); pids="$pids $new"; wait_ns "$new"
in_pod "$new" "mount $SPOKE_ROOT '$N/mnt-strata'"
in_pod "$new" "$INIT"
check "$(in_pod "$new" "cat '$N/mnt-strata/data/f'" 2>&1)" one \
    "the new pod sees the old pod's mount"
# the old pod goes, its spoke having exited without unmounting (succession)
kill "$old"; wait "$old" 2>/dev/null || true
check "$(cat "$N/mnt-strata/data/f" 2>&1)" one "the node keeps the mount"
check "$(in_pod "$new" "cat '$N/mnt-strata/data/f'" 2>&1)" one "the new pod keeps the mount"
check "$(in_pod "$csi" "cat '$N/mnt-strata/data/f'" 2>&1)" one "the plugin keeps the mount"
echo OK
""",
)


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    """The spoke's and the plugin's propagation of /mnt/strata, and the spoke's init
    container's command, as rendered."""
    objects = k8s.gpu_region(tmp_path_factory)

    def spec(daemonset: str) -> k8s.Obj:
        pod: k8s.Obj = objects[("DaemonSet", "strata", daemonset)]["spec"]["template"]["spec"]
        return pod

    def mode(pod: k8s.Obj, container: k8s.Obj) -> str | None:
        return k8s.host_path_propagation(pod, container, "/mnt/strata")

    spoke, csi = spec("strata-spoke"), spec("strata-spoke-csi")
    (init,) = spoke["initContainers"]
    (csi_container,) = [c for c in csi["containers"] if c["name"] == "csi"]
    return {
        "spoke": mode(spoke, next(c for c in spoke["containers"] if c["name"] == "spoke")),
        "csi": mode(csi, csi_container),
        "init": init["command"][-1],
    }


def _play(tmp_path: Path, spoke: str | None, csi: str | None, init: str) -> str:
    init = init.replace("/mnt/strata", f"{tmp_path / 'node'}/mnt-strata")
    return k8s.play_pods(tmp_path, SCRIPT, k8s.PROPAGATION[spoke], k8s.PROPAGATION[csi], init)


def test_the_old_pods_mount_outlives_it_for_the_new_pod(
    pods: dict[str, str | None], tmp_path: Path
) -> None:
    assert pods["spoke"] == "Bidirectional" and pods["csi"] == "HostToContainer"
    assert pods["init"] is not None
    out = _play(tmp_path, pods["spoke"], pods["csi"], pods["init"])
    assert out.strip().endswith("OK"), out


def test_the_old_init_container_would_have_detached_the_live_mount(
    pods: dict[str, str | None], tmp_path: Path
) -> None:
    """The play can fail: the init container of the release before succession
    (``umount -l`` whatever is there) takes the old pod's live mount from the new pod."""
    old_init = "umount -l /mnt/strata/data 2>/dev/null; mkdir -p /mnt/strata/data"
    out = _play(tmp_path, pods["spoke"], pods["csi"], old_init)
    assert "FAIL: the new pod sees the old pod's mount" in out, out


def test_a_spoke_pod_without_propagation_never_sees_the_old_mount(tmp_path: Path) -> None:
    out = _play(tmp_path, None, "HostToContainer", "true")
    assert "FAIL: the new pod sees the old pod's mount" in out, out
