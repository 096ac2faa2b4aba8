"""The two region-B DaemonSets' mount propagation, played with Linux mount namespaces:
the spoke's pod and strata-spoke-csi's pod as two namespaces of one "node" (itself a
private namespace, so nothing reaches this machine's mounts), each node directory taken
with the propagation the rendered manifests give it. A tmpfs stands in for the FUSE
mount: propagation is the same for both.

What it shows: the spoke's mount reaches the node and the plugin; a bind the plugin makes
under the kubelet's pods directory reaches the node and outlives the plugin's pod (a
plugin rollout leaves published volumes in place); a new plugin pod sees the mount and
the binds; and a mount the spoke makes again (a new spoke pod) reaches a plugin that kept
running. With the plugin's mode taken as ``None`` instead, the check fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy import k8s_support as k8s

pytestmark = k8s.needs_namespaces

# $1 the node's directory; $2 the spoke's mode for the mount root; $3 and $4 the plugin's
# for the mount root and the pods directory. Runs in a private mount namespace of its own.
SCRIPT = k8s.pod_play(
    "N=$1; SPOKE_ROOT=$2; CSI_ROOT=$3; CSI_PODS=$4",
    r"""mkdir -p "$N/mnt-strata/data" "$N/pods/uid/volumes/v"
# the node's own directories are shared, as on a systemd host
for d in mnt-strata pods; do mount --bind "$N/$d" "$N/$d"; mount --make-shared "$N/$d"; done

# strata-spoke-csi's pod starts first (a new node: both start at once)
csi=$(pod); pids="$pids $csi"; wait_ns "$csi"
in_pod "$csi" "mount $CSI_ROOT '$N/mnt-strata' && mount $CSI_PODS '$N/pods'"
# the spoke's pod mounts (the FUSE mount) below its root
spoke=$(pod); pids="$pids $spoke"; wait_ns "$spoke"
in_pod "$spoke" "mount $SPOKE_ROOT '$N/mnt-strata' && mount -t tmpfs spoke-1 '$N/mnt-strata/data' \
    && mkdir '$N/mnt-strata/data/v1' && echo one > '$N/mnt-strata/data/v1/f'"
check "$(cat "$N/mnt-strata/data/v1/f" 2>&1)" one "the node sees the spoke's mount"
check "$(in_pod "$csi" "cat '$N/mnt-strata/data/v1/f'" 2>&1)" one \
    "the plugin sees the spoke's mount"
# the plugin publishes v1 to a pod: a bind under the kubelet's pods directory
in_pod "$csi" "mount --bind '$N/mnt-strata/data/v1' '$N/pods/uid/volumes/v'"
check "$(cat "$N/pods/uid/volumes/v/f" 2>&1)" one "the node sees the plugin's bind"
# the plugin's pod is replaced (a rollout): its namespace goes, the bind stays
kill "$csi"; wait "$csi" 2>/dev/null || true
check "$(cat "$N/pods/uid/volumes/v/f" 2>&1)" one "the bind outlives the plugin's pod"
grep -q " $N/pods/uid/volumes/v " /proc/self/mountinfo || { echo "FAIL: the bind is gone"; exit 1; }
csi=$(pod); pids="$pids $csi"; wait_ns "$csi"
in_pod "$csi" "mount $CSI_ROOT '$N/mnt-strata' && mount $CSI_PODS '$N/pods'"
both=$(in_pod "$csi" "cat '$N/mnt-strata/data/v1/f' '$N/pods/uid/volumes/v/f'" 2>&1 | tr '\n' ' ')
check "$both" "one one " "a new plugin sees the mount and the bind it is to unpublish"
# the spoke's pod is replaced: its mount goes, the new pod mounts again; the plugin that
# kept running sees the new mount
in_pod "$spoke" "umount '$N/mnt-strata/data'"
kill "$spoke"; wait "$spoke" 2>/dev/null || true
spoke=$(pod); pids="$pids $spoke"; wait_ns "$spoke"
in_pod "$spoke" "mount $SPOKE_ROOT '$N/mnt-strata' && mount -t tmpfs spoke-2 '$N/mnt-strata/data' \
    && mkdir '$N/mnt-strata/data/v2' && echo two > '$N/mnt-strata/data/v2/f'"
check "$(in_pod "$csi" "cat '$N/mnt-strata/data/v2/f'" 2>&1)" two \
    "the plugin sees a new spoke's mount"
echo OK
""",
)


@pytest.fixture(scope="module")
def modes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    """The mountPropagation of the node directories each pod shares, as rendered."""
    objects = k8s.gpu_region(tmp_path_factory)

    def mode(daemonset: str, container: str, host_path: str) -> str | None:
        pod: k8s.Obj = objects[("DaemonSet", "strata", daemonset)]["spec"]["template"]["spec"]
        (one,) = [c for c in pod["containers"] if c["name"] == container]
        return k8s.host_path_propagation(pod, one, host_path)

    return {
        "spoke_root": mode("strata-spoke", "spoke", "/mnt/strata"),
        "csi_root": mode("strata-spoke-csi", "csi", "/mnt/strata"),
        "csi_pods": mode("strata-spoke-csi", "csi", "/var/lib/kubelet/pods"),
    }


def _play(
    tmp_path: Path, spoke_root: str | None, csi_root: str | None, csi_pods: str | None
) -> str:
    modes = (k8s.PROPAGATION[spoke_root], k8s.PROPAGATION[csi_root], k8s.PROPAGATION[csi_pods])
    return k8s.play_pods(tmp_path, SCRIPT, *modes)


def test_the_manifests_modes_keep_mounts_and_binds(
    modes: dict[str, str | None], tmp_path: Path
) -> None:
    assert modes == {
        "spoke_root": "Bidirectional",
        "csi_root": "HostToContainer",
        "csi_pods": "Bidirectional",
    }
    out = _play(tmp_path, modes["spoke_root"], modes["csi_root"], modes["csi_pods"])
    assert out.strip().endswith("OK"), out


def test_a_plugin_without_propagation_misses_the_spokes_mount(tmp_path: Path) -> None:
    """The play can fail: a plugin pod whose mount root does not receive the node's mounts
    (no mountPropagation) never sees the spoke's mount."""
    out = _play(tmp_path, "Bidirectional", None, "Bidirectional")
    assert "FAIL: the plugin sees the spoke's mount" in out, out
