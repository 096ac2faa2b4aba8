"""What the CSI plugin counts of its publications (csi/records.py) and the caps it checks
them against (csi/volumes.py): a pod's, a namespace's and the node's, rebuilt from the
records at start; records of an older plugin (no namespace) still load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from csi import volumes as volumes_module
from csi.records import Publication, StateDir
from csi.targets import Targets
from csi.volumes import TooManyVolumes, Volumes


def _target(pods: Path, pod: str, i: int) -> str:
    return str(pods / pod / "volumes" / "kubernetes.io~csi" / f"v{i}" / "mount")


def test_counts_by_pod_and_namespace_survive_a_restart(tmp_path: Path) -> None:
    pods = tmp_path / "pods"
    state = StateDir(tmp_path / "state", pods)
    for i in range(3):
        state.put(Publication(f"vol{i}", _target(pods, "pod-a", i), "ds", "v1", "v1", "team-a"))
    state.put(Publication("vol9", _target(pods, "pod-b", 0), "ds", "v1", "v1", "team-b"))
    state.put(Publication("vol0", _target(pods, "pod-a", 0), "ds", "v1", "v1", "team-a"))  # again
    # a record an older plugin wrote: no namespace
    old = {"volume_id": "old", "target": _target(pods, "pod-c", 0), "dataset": "ds"}
    (tmp_path / "state" / "old.json").write_text(json.dumps({**old, "ref": "v1", "version": "v1"}))
    again = StateDir(tmp_path / "state", pods)
    for counted in (state, again):
        assert counted.held(state.pod_of(_target(pods, "pod-a", 0))) == 3
        assert counted.in_namespace("team-a") == 3 and counted.in_namespace("team-b") == 1
    assert len(state) == 4 and len(again) == 5
    assert again.in_namespace("") == 1
    state.drop(_target(pods, "pod-a", 1))
    assert state.held("pod-a") == 2 and state.in_namespace("team-a") == 2 and len(state) == 3
    state.drop(_target(pods, "pod-a", 1))  # again: nothing
    assert len(state) == 3


def test_a_namespace_holds_at_most_its_quarter_of_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The eighteenth probe: one namespace's 16 pods of 64 volumes took all 1,024 of the
    node's, and every other tenant's pod there was refused."""
    monkeypatch.setattr(volumes_module, "MAX_POD_VOLUMES", 2)
    monkeypatch.setattr(volumes_module, "MAX_NAMESPACE_VOLUMES", 4)
    monkeypatch.setattr(volumes_module, "MAX_NODE_VOLUMES", 6)
    pods = tmp_path / "pods"
    pods.mkdir()
    (tmp_path / "mount").mkdir()
    plugin = Volumes(tmp_path / "mount", tmp_path / "state", Targets(pods))
    root = plugin.targets.root

    def room(pod: str, i: int, namespace: str) -> str:
        target = Path(_target(root, pod, i))
        try:
            plugin._room(target, namespace)
        except TooManyVolumes as err:
            return str(err)
        plugin.state.put(Publication(f"{pod}-{i}", str(target), "ds", "v1", "v1", namespace))
        return "ok"

    assert [room("p1", i, "greedy") for i in range(3)] == [
        "ok",
        "ok",
        "pod p1 holds 2 Strata volumes, the most one pod may",
    ]
    assert [room("p2", i, "greedy") for i in range(2)] == ["ok", "ok"]
    assert "namespace greedy hold 4" in room("p3", 0, "greedy")
    assert [room("q1", 0, "polite"), room("q1", 1, "polite")] == ["ok", "ok"]
    assert "this node holds 6" in room("q2", 0, "polite")
