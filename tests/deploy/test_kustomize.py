"""deploy/kustomize.py's strategic merge patches: what the overlays rely on (merge by
name, by mountPath, ``null`` and ``$patch: delete``, whole-list replacement), the same as
``kubectl kustomize`` where it is installed, and JSON patches by list index refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deploy.kustomize import KustomizeError, render
from tests.deploy.k8s_support import K8S, OVERLAYS, by_key, kubectl_render

BASE_JOB = """\
apiVersion: batch/v1
kind: Job
metadata: {name: j}
spec:
  template:
    spec:
      containers:
        - name: a
          image: x
          args: [one, two]
          env:
            - {name: A, value: "1"}
            - {name: B, value: "2"}
            - {name: C, value: "3"}
          volumeMounts:
            - {name: v, mountPath: /data, readOnly: true}
            - {name: o, mountPath: /out}
        - name: b
          image: y
      volumes:
        - name: v
          csi: {driver: d}
        - name: o
          emptyDir: {}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: m, labels: {a: "1"}}
spec:
  selector: {matchLabels: {app: x}}
  endpoints:
    - {port: metrics, interval: 15s}
"""

PATCHES = """\
resources: [../base]
patches:
  - patch: |-
      apiVersion: batch/v1
      kind: Job
      metadata:
        name: j
      spec:
        template:
          spec:
            containers:
              - name: a
                args: [three]
                env:
                  - {name: B, value: "22"}
                  - {name: D, value: "4"}
                  - {name: Z, $patch: delete}
                volumeMounts:
                  - {mountPath: /data, $patch: delete}
                  - {name: v, mountPath: /mnt, readOnly: true}
            volumes:
              - name: v
                csi: null
                hostPath: {path: /mnt, type: Directory}
  - patch: |-
      apiVersion: monitoring.coreos.com/v1
      kind: ServiceMonitor
      metadata:
        name: m
        labels: {release: r}
      spec:
        endpoints:
          - {port: metrics, interval: 30s}
"""


def _tree(tmp_path: Path, overlay: str) -> Path:
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "objects.yaml").write_text(BASE_JOB)
    (tmp_path / "base" / "kustomization.yaml").write_text("resources: [objects.yaml]\n")
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "kustomization.yaml").write_text(overlay)
    return tmp_path / "overlay"


def test_strategic_merge(tmp_path: Path) -> None:
    objects = by_key(render(_tree(tmp_path, PATCHES)))
    pod = objects[("Job", "", "j")]["spec"]["template"]["spec"]
    a, b = pod["containers"]
    assert a["args"] == ["three"], "args are replaced whole"
    # patch elements first, in the patch's order, then the object's others (kustomize's)
    assert a["env"] == [
        {"name": "B", "value": "22"},
        {"name": "D", "value": "4"},
        {"name": "A", "value": "1"},
        {"name": "C", "value": "3"},
    ]
    assert a["volumeMounts"] == [
        {"name": "v", "mountPath": "/mnt", "readOnly": True},
        {"name": "o", "mountPath": "/out"},
    ]
    assert b == {"name": "b", "image": "y"}, "a container the patch does not name is kept"
    assert pod["volumes"][0] == {"name": "v", "hostPath": {"path": "/mnt", "type": "Directory"}}
    monitor = objects[("ServiceMonitor", "", "m")]
    assert monitor["metadata"]["labels"] == {"a": "1", "release": "r"}
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "interval": "30s"}]


def test_strategic_merge_is_kubectls(tmp_path: Path) -> None:
    overlay = _tree(tmp_path, PATCHES)
    reference = kubectl_render(overlay)
    if reference is None:
        pytest.skip("kubectl is not installed")
    assert by_key(render(overlay)) == by_key(reference)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (  # RFC 6902, by list index: what the overlays did before
            "  - target: {kind: Job, name: j}\n"
            "    patch: |-\n"
            "      - op: replace\n"
            "        path: /spec/template/spec/containers/0/image\n"
            "        value: z\n",
            "no target",
        ),
        (
            "  - patch: |-\n"
            "      - op: replace\n"
            "        path: /spec/template/spec/containers/0/image\n"
            "        value: z\n",
            "JSON patches address list elements by index",
        ),
        (
            "  - patch: |-\n"
            "      apiVersion: batch/v1\n"
            "      kind: Job\n"
            "      metadata: {name: nobody}\n",
            "matches 0 objects",
        ),
        (  # a list whose merge key this renderer does not know
            "  - patch: |-\n"
            "      apiVersion: batch/v1\n"
            "      kind: Job\n"
            "      metadata: {name: j}\n"
            "      spec: {template: {spec: {tolerations: [{key: k, operator: Exists}]}}}\n",
            "merge rule is not known",
        ),
        (
            "  - patch: |-\n"
            "      apiVersion: batch/v1\n"
            "      kind: Job\n"
            "      metadata: {name: j}\n"
            "      spec: {template: {spec: {$retainKeys: [volumes]}}}\n",
            "directive",
        ),
    ],
)
def test_what_is_refused(tmp_path: Path, patch: str, message: str) -> None:
    overlay = _tree(tmp_path, f"resources: [../base]\npatches:\n{patch}")
    with pytest.raises(KustomizeError, match=message):
        render(overlay)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_patch_by_name(overlay: str) -> None:
    """Every patch of the shipped overlays is a strategic merge patch naming its object,
    and no patch text holds a JSON pointer into a list (``/0/``)."""
    spec = yaml.safe_load((K8S / "overlays" / overlay / "kustomization.yaml").read_text())
    for patch in spec.get("patches", []):
        assert set(patch) == {"patch"}, patch
        body = yaml.safe_load(patch["patch"])
        assert isinstance(body, dict) and body["metadata"]["name"], patch
        assert "/0/" not in patch["patch"] and "op:" not in patch["patch"]
