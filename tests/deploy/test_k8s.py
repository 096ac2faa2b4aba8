"""deploy/k8s: rendered by kustomize, every object valid for Kubernetes (strict), and the
properties schemas cannot see across every overlay: no `latest`, memory limits, Pod
Security levels, no service-account token, no world-readable Secret. The GPU region's
workloads are ``test_k8s_gpu.py``'s, the hub region's ``test_k8s_hub.py``'s."""

from __future__ import annotations

import base64
import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from deploy.kustomize import KustomizeError, render
from deploy.prometheusrule import OUTPUT as PROMETHEUS_RULE_FILE
from deploy.prometheusrule import RELEASE, RULES
from deploy.prometheusrule import render as render_prometheus_rule
from tests.deploy.k8s_support import (
    OVERLAYS,
    Obj,
    by_key,
    k8s_fixture,  # noqa: F401  (the k8s fixture)
    kubectl_render,
    objects_fixture,  # noqa: F401  (the objects fixture)
    spoke_daemonset,
)

KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")
"""The oldest Kubernetes the manifests promise to work on, and the newest schema known."""

# The part of prometheus-operator's ServiceMonitor CRD (monitoring.coreos.com/v1,
# https://prometheus-operator.dev/docs/api-reference/api/#monitoring.coreos.com/v1.ServiceMonitor)
# the manifests use, strict like kubernetes-validate --strict: kubernetes-validate knows
# no CRDs, and a typo here would otherwise pass unnoticed.
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
SERVICE_MONITOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "namespace": {"type": "string"},
                "labels": _STRINGS,
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchLabels": _STRINGS},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "relabelings": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "sourceLabels": {
                                            "type": "array",
                                            "items": {"type": "string"},
                                        },
                                        "targetLabel": {"type": "string"},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


# The part of prometheus-operator's PrometheusRule CRD (monitoring.coreos.com/v1,
# https://prometheus-operator.dev/docs/api-reference/api/#monitoring.coreos.com/v1.PrometheusRule)
# the generated object uses, strict: a rule is a recording or an alert rule.
_RULE_COMMON = {
    "expr": {"type": "string", "minLength": 1},
    "for": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
    "labels": _STRINGS,
    "annotations": _STRINGS,
}
PROMETHEUS_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": SERVICE_MONITOR["properties"]["metadata"],
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string"},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "oneOf": [
                                        {
                                            "type": "object",
                                            "additionalProperties": False,
                                            "required": ["record", "expr"],
                                            "properties": {
                                                "record": {"type": "string"},
                                                **_RULE_COMMON,
                                            },
                                        },
                                        {
                                            "type": "object",
                                            "additionalProperties": False,
                                            "required": ["alert", "expr"],
                                            "properties": {
                                                "alert": {"type": "string"},
                                                **_RULE_COMMON,
                                            },
                                        },
                                    ]
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}
SCHEMAS = {"ServiceMonitor": SERVICE_MONITOR, "PrometheusRule": PROMETHEUS_RULE}


def validate(obj: Obj, version: str) -> None:
    """Raises when ``obj`` is not a valid object of its kind (unknown fields included)."""
    if obj["kind"] in SCHEMAS:
        jsonschema.validate(obj, SCHEMAS[obj["kind"]])
    else:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_python_renderer_matches_kubectl(k8s: Path, overlay: str) -> None:
    reference = kubectl_render(k8s / "overlays" / overlay)
    if reference is None:
        pytest.skip("kubectl is not installed: the Python renderer stands alone")
    ours = by_key(render(k8s / "overlays" / overlay))
    assert _decoded(ours) == _decoded(by_key(reference))


def _decoded(objects: dict[tuple[str, str, str], Obj]) -> dict[tuple[str, str, str], Obj]:
    """Secret data as bytes: kubectl folds long base64 lines, which means the same."""
    out = copy.deepcopy(objects)
    for obj in out.values():
        if obj["kind"] == "Secret":
            obj["data"] = {k: base64.b64decode(v) for k, v in obj["data"].items()}
    return out


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_valid(
    objects: dict[str, dict[tuple[str, str, str], Obj]], overlay: str, version: str
) -> None:
    assert objects[overlay], "the overlay renders to nothing"
    for key, obj in objects[overlay].items():
        try:
            validate(obj, version)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            pytest.fail(f"{overlay} {key} on {version}: {exc.message}")


def test_the_validators_reject_a_typo(objects: dict[str, dict[tuple[str, str, str], Obj]]) -> None:
    """The checks above can fail: a misspelt field and a wrong type are both caught."""
    spoke = copy.deepcopy(spoke_daemonset(objects))
    mount = spoke["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][1]
    mount["mountPropogation"] = mount.pop("mountPropagation")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(spoke, KUBERNETES_VERSIONS[-1])
    monitor = copy.deepcopy(objects["gpu-region"][("ServiceMonitor", "strata", "strata-spoke")])
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor, KUBERNETES_VERSIONS[-1])


def test_prometheus_rule_is_the_rules_file(
    objects: dict[str, dict[tuple[str, str, str], Obj]],
) -> None:
    """Each region gets one PrometheusRule whose groups are deploy/prometheus/rules.yml's
    (the file promtool checks), committed fresh from deploy.prometheusrule; it and every
    ServiceMonitor carry the ``release`` label kube-prometheus-stack selects on."""
    assert PROMETHEUS_RULE_FILE.read_text() == render_prometheus_rule(), (
        "stale: run python -m deploy.prometheusrule"
    )
    groups = yaml.safe_load(RULES.read_text())["groups"]
    for overlay in ("hub-region", "gpu-region"):
        (rule,) = [o for o in objects[overlay].values() if o["kind"] == "PrometheusRule"]
        assert rule["spec"]["groups"] == groups
        monitors = [o for o in objects[overlay].values() if o["kind"] == "ServiceMonitor"]
        assert monitors, overlay
        for obj in [rule, *monitors]:
            assert obj["metadata"]["labels"].get("release") == RELEASE, obj["metadata"]["name"]
    broken = copy.deepcopy(rule)
    broken["spec"]["groups"][0]["rules"][0]["recrod"] = "typo"
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, KUBERNETES_VERSIONS[-1])


def test_renderer_refuses_what_it_does_not_know(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\nreplicas: []\n")
    with pytest.raises(KustomizeError, match="replicas"):
        render(tmp_path)


def _pod_spec(obj: Obj) -> Obj | None:
    """The pod template's spec of a workload (a CronJob's through its jobTemplate)."""
    spec = obj.get("spec", {})
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    template: Obj | None = spec.get("template", {}).get("spec")
    return template


def _containers(obj: Obj) -> list[Obj]:
    spec = _pod_spec(obj) or {}
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def test_images_are_pinned_and_resources_set(
    objects: dict[str, dict[tuple[str, str, str], Obj]],
) -> None:
    seen = 0
    for overlay in OVERLAYS:
        for key, obj in objects[overlay].items():
            for container in _containers(obj):
                seen += 1
                image: str = container["image"]
                tag = image.rpartition("/")[2].partition(":")[2]
                assert "@sha256:" in image or re.fullmatch(r"v?[0-9][\w.-]*", tag), (key, image)
                assert tag != "latest", (key, image)
                limits: dict[str, Any] = container["resources"]["limits"]
                assert "memory" in limits, f"{key} {container['name']} has no memory limit"
    # the hub and its grant-key init; gc; the example publish; the spoke's init and spoke;
    # strata-spoke-csi's csi and node-driver-registrar; two example Jobs
    assert seen == 10


def _pods(objects: dict[tuple[str, str, str], Obj]) -> list[tuple[tuple[str, str, str], Obj]]:
    return [(key, pod) for key, obj in objects.items() if (pod := _pod_spec(obj)) is not None]


REGION = {
    "hub-region": "a",
    "hub-publish": "a",
    "gpu-region": "b",
    "train": "b",
    "train-hostpath": "b",
}
"""The cluster each overlay is applied to: the training overlays go beside gpu-region."""


def test_pod_security_is_privileged_only_where_the_spoke_runs(
    objects: dict[str, dict[tuple[str, str, str], Obj]],
) -> None:
    """Every pod lands in a Namespace an overlay of its region makes, which enforces a
    Pod Security level: ``privileged`` only where a privileged container (the spoke, the
    CSI plugin) runs, ``restricted`` elsewhere, and the pods there meet it (the parts of
    the restricted profile a manifest decides)."""
    assert set(REGION) == set(OVERLAYS)
    levels: dict[tuple[str, str], str] = {}
    for overlay in OVERLAYS:
        for obj in objects[overlay].values():
            if obj["kind"] == "Namespace":
                labels = obj["metadata"].get("labels", {})
                levels[(REGION[overlay], obj["metadata"]["name"])] = labels.get(
                    "pod-security.kubernetes.io/enforce"
                )
    privileged_in: set[tuple[str, str]] = set()
    for overlay in OVERLAYS:
        for key, pod in _pods(objects[overlay]):
            namespace = (REGION[overlay], key[1])
            assert namespace in levels, f"{overlay} {key}: no overlay makes its namespace"
            containers = [*pod.get("initContainers", []), *pod["containers"]]
            if any(c.get("securityContext", {}).get("privileged") for c in containers):
                privileged_in.add(namespace)
                assert levels[namespace] == "privileged", (overlay, key)
            if levels[namespace] != "restricted":
                assert "hostPath" not in str(pod) or levels[namespace] == "privileged", key
                continue
            context = pod.get("securityContext", {})
            assert context.get("runAsNonRoot") is True, key
            assert context.get("seccompProfile", {}).get("type") == "RuntimeDefault", key
            assert not any("hostPath" in v for v in pod.get("volumes", [])), key
            for container in containers:
                sc = container.get("securityContext", {})
                assert sc.get("allowPrivilegeEscalation") is False, (key, container["name"])
                assert sc.get("capabilities", {}).get("drop") == ["ALL"], key
    assert {ns for ns, level in levels.items() if level == "privileged"} == privileged_in
    assert levels == {
        ("a", "strata"): "restricted",
        ("b", "strata"): "privileged",
        ("b", "strata-train"): "restricted",
    }


def test_no_service_account_token_and_secrets_not_world_readable(
    objects: dict[str, dict[tuple[str, str, str], Obj]],
) -> None:
    """No pod calls the Kubernetes API, so none gets a token; every Secret volume sets a
    ``defaultMode`` that others cannot read (Kubernetes' default is 0644)."""
    seen = 0
    for overlay in OVERLAYS:
        for key, pod in _pods(objects[overlay]):
            seen += 1
            assert pod.get("automountServiceAccountToken") is False, key
            for volume in pod.get("volumes", []):
                if "secret" in volume:
                    mode = volume["secret"].get("defaultMode")
                    assert mode is not None and mode & 0o007 == 0, (key, volume)
    # hub, gc, the example publish, spoke, strata-spoke-csi, the example Job and its
    # hostPath variant
    assert seen == 7
