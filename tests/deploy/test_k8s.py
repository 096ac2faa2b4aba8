"""deploy/k8s: rendered by kustomize, every object valid for Kubernetes (strict), and the
properties schemas cannot see: mount propagation, the node's disk, probes, no `latest`."""

from __future__ import annotations

import base64
import copy
import hashlib
import re
import urllib.parse
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
from hub.auth.tokens import MANAGED_VERSION
from tests.deploy.k8s_support import (
    OVERLAYS,
    Obj,
    by_key,
    copy_tree,
    kubectl_render,
    rendered,
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


@pytest.fixture(scope="module")
def k8s(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_tree(tmp_path_factory.mktemp("deploy"))


@pytest.fixture(scope="module")
def objects(k8s: Path) -> dict[str, dict[tuple[str, str, str], Obj]]:
    return {overlay: by_key(rendered(k8s, overlay)) for overlay in OVERLAYS}


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


def _spoke(objects: dict[str, dict[tuple[str, str, str], Obj]]) -> Obj:
    return objects["gpu-region"][("DaemonSet", "strata", "strata-spoke")]


def test_the_validators_reject_a_typo(objects: dict[str, dict[tuple[str, str, str], Obj]]) -> None:
    """The checks above can fail: a misspelt field and a wrong type are both caught."""
    spoke = copy.deepcopy(_spoke(objects))
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


def _flag(args: list[str], name: str) -> str:
    values = [a.partition("=")[2] for a in args if a.startswith(f"{name}=")]
    assert len(values) == 1, f"{name} given {len(values)} times in {args}"
    return values[0]


def _mount_for(container: Obj, pod: Obj, path: str) -> tuple[Obj, Obj]:
    """The volumeMount holding ``path`` (the deepest) and its volume."""
    mounts = [m for m in container["volumeMounts"] if (path + "/").startswith(m["mountPath"] + "/")]
    assert mounts, f"{path} is on no volume: it would be in the container's overlay"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    return mount, volume


def _named(pod: Obj, name: str) -> Obj:
    (container,) = [c for c in pod["containers"] if c["name"] == name]
    return container


def test_spoke_daemonset(objects: dict[str, dict[tuple[str, str, str], Obj]]) -> None:
    pod = _spoke(objects)["spec"]["template"]["spec"]
    spoke = _named(pod, "spoke")
    (init,) = pod["initContainers"]
    args = spoke["args"]
    assert spoke["securityContext"]["privileged"] is True, "Bidirectional needs privileged"
    assert spoke["securityContext"]["runAsUser"] == 0, "the image's own user is not root"
    cache_mount, cache_volume = _mount_for(spoke, pod, _flag(args, "--cache-dir"))
    assert "hostPath" in cache_volume, "the cache must be on the node's own disk"
    assert "mountPropagation" not in cache_mount
    mountpoint = _flag(args, "--mount")
    root_mount, root_volume = _mount_for(spoke, pod, mountpoint)
    assert root_mount["mountPropagation"] == "Bidirectional"
    assert root_mount["mountPath"] != mountpoint, "mount below the shared root, not on it"
    assert root_volume["hostPath"]["path"] == "/mnt/strata"
    init_mount, init_volume = _mount_for(init, pod, mountpoint)
    assert init_volume is root_volume and init_mount["mountPropagation"] == "Bidirectional"
    assert init["command"][-1].endswith(f"mkdir -p {mountpoint}"), "the spoke needs its mountpoint"
    # a surge pod's init runs beside the old pod: it detaches only a dead mount (stat fails)
    assert init["command"][-1].startswith(f"stat {mountpoint} >/dev/null 2>&1 || umount -l")
    # succession: the new pod takes the old one's connection; the old one idles until deleted
    assert "--take-over" in args and _flag(args, "--after-succession") == "wait"
    _, fuse_volume = _mount_for(spoke, pod, "/dev/fuse")
    assert fuse_volume["hostPath"] == {"path": "/dev/fuse", "type": "CharDevice"}
    assert spoke["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert spoke["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # the admin API (token, /v1/) only on the pod's loopback; the probes and Prometheus on
    # --metrics, which serves nothing else; no port of the node
    assert _flag(args, "--admin").rpartition(":")[0] == "127.0.0.1"
    metrics_port = int(_flag(args, "--metrics").rpartition(":")[2])
    ports = {p["name"]: p["containerPort"] for p in spoke["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert ports[spoke[probe]["httpGet"]["port"]] == metrics_port, probe
    assert not any("hostPort" in p for c in pod["containers"] for p in c.get("ports", []))
    service = objects["gpu-region"][("Service", "strata", "strata-spoke")]
    monitor = objects["gpu-region"][("ServiceMonitor", "strata", "strata-spoke")]
    (endpoint,) = monitor["spec"]["endpoints"]
    (scraped,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert ports[scraped["targetPort"]] == metrics_port
    policy = objects["gpu-region"][("NetworkPolicy", "strata", "strata-spoke")]
    admitted = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert (
        metrics_port in admitted and int(_flag(args, "--admin").rpartition(":")[2]) not in admitted
    )
    pre_stop = spoke["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[:3] == ["python3", "-m", "deploy.drain"]
    assert _flag(pre_stop, "--mount") == mountpoint, "the drain watches the spoke's mount"
    assert pod["hostPID"] is True, "the drain must see the training pods' processes"
    assert float(_flag(pre_stop, "--timeout")) < pod["terminationGracePeriodSeconds"]
    # a drain that has to wait cordons the node: its name, an expiring token of a service
    # account that may patch nodes and nothing else, in the spoke container only
    assert "--cordon" in pre_stop
    env = {e["name"]: e for e in spoke["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert pod["automountServiceAccountToken"] is False
    account = pod["serviceAccountName"]
    _, api_volume = _mount_for(spoke, pod, "/var/run/secrets/kubernetes.io/serviceaccount/token")
    sources = api_volume["projected"]["sources"]
    assert {"path": "token", "expirationSeconds": 3600} in [
        src["serviceAccountToken"] for src in sources if "serviceAccountToken" in src
    ]
    gpu = objects["gpu-region"]
    (binding,) = [
        o for o in gpu.values() if o["kind"] == "ClusterRoleBinding"
        and {"kind": "ServiceAccount", "name": account, "namespace": "strata"} in o["subjects"]
    ]  # fmt: skip
    role = gpu[("ClusterRole", "", binding["roleRef"]["name"])]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    assert not any(a.startswith("--hub=") and "example" in a for a in args)
    # the regional mesh: a peer port, advertised as the pod's IP, found through a headless
    # Service that lists spokes before they are ready
    peer_port = int(_flag(args, "--peer-listen").rpartition(":")[2])
    assert ports["peer"] == peer_port
    assert _flag(args, "--peer-advertise") == f"$(POD_IP):{peer_port}"
    env = {e["name"]: e for e in spoke["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    service_name = _flag(args, "--peers-dns").split(".")[0]
    (peers,) = [
        o for o in objects["gpu-region"].values()
        if o["kind"] == "Service" and o["metadata"]["name"] == service_name
    ]  # fmt: skip
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"]
    assert peers["spec"]["ports"][0]["port"] == peer_port
    assert peers["spec"]["selector"].items() <= pod_labels(_spoke(objects)).items()
    # the mesh runs mTLS with the region token: every file from the peer Secret, which the
    # overlay generates with exactly those keys; the name the certificate carries is the
    # peers' Service (pod IPs change), never the plaintext opt-out
    assert not any(a.startswith("--peer-insecure") for a in args)
    peer_flags = ("--peer-cert", "--peer-key", "--peer-ca", "--peer-token-file")
    mounts = {_mount_for(spoke, pod, _flag(args, f))[1]["secret"]["secretName"] for f in peer_flags}
    (secret_name,) = mounts
    secret = objects["gpu-region"][("Secret", "strata", secret_name)]
    (mount,) = [
        m for m in spoke["volumeMounts"] if _flag(args, "--peer-ca").startswith(m["mountPath"])
    ]
    assert mount.get("readOnly") is True
    assert {_flag(args, f).removeprefix(mount["mountPath"] + "/") for f in peer_flags} == set(
        secret["data"]
    )
    assert _flag(args, "--peer-server-name") == f"{service_name}.$(POD_NAMESPACE).svc"


def _job(objects: dict[str, dict[tuple[str, str, str], Obj]], overlay: str) -> Obj:
    (job,) = [o for o in objects[overlay].values() if o["kind"] == "Job"]
    return job


def _csi_plugin(objects: dict[str, dict[tuple[str, str, str], Obj]]) -> Obj:
    return objects["gpu-region"][("DaemonSet", "strata", "strata-spoke-csi")]


def _node_path(container: Obj, pod: Obj, path: str) -> str:
    """``path`` of the container as the node sees it: through its hostPath volume."""
    mount, volume = _mount_for(container, pod, path)
    assert "hostPath" in volume, f"{path} is not on the node"
    node: str = volume["hostPath"]["path"] + path.removeprefix(mount["mountPath"])
    return node


def test_csi_plugin_in_a_daemonset_of_its_own(
    objects: dict[str, dict[tuple[str, str, str], Obj]],
) -> None:
    """strata-csi and its registrar in the DaemonSet strata-spoke-csi, not in the spoke's
    pod (rolling either leaves the other running), on the same nodes: the spoke's mount as
    the node sees it (the spoke shares it Bidirectional, the plugin reads it
    HostToContainer at the spoke's --mount), the kubelet's pods directory at the kubelet's
    own path (Bidirectional, so the binds reach the node), its socket where the registrar
    tells the kubelet it is, its records on the node, and a CSIDriver of its name for
    ephemeral inline volumes only, nothing to attach."""
    gpu = objects["gpu-region"]
    spoke_set, csi_set = _spoke(objects), _csi_plugin(objects)
    spoke_pod = spoke_set["spec"]["template"]["spec"]
    pod = csi_set["spec"]["template"]["spec"]
    assert [c["name"] for c in spoke_pod["containers"]] == ["spoke"], "the spoke's pod is its own"
    assert {c["name"] for c in pod["containers"]} == {"csi", "node-driver-registrar"}
    assert not pod.get("initContainers")
    assert pod_labels(csi_set).items() != pod_labels(spoke_set).items()
    assert csi_set["spec"]["selector"]["matchLabels"].items() <= pod_labels(csi_set).items()
    assert not csi_set["spec"]["selector"]["matchLabels"].items() <= pod_labels(spoke_set).items()
    # wherever a spoke runs, and nowhere else
    for field in ("nodeSelector", "tolerations", "priorityClassName"):
        assert pod[field] == spoke_pod[field], field
    assert not pod.get("hostPID"), "only the spoke's drain needs the node's processes"
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # a rollout of N nodes goes a quarter at a time, the spoke's too: a new spoke pod
    # beside the old one takes over its mount (succession), so no node is ever without one
    assert csi_set["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "25%"},
    }
    assert spoke_set["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0},
    }
    spoke = _named(spoke_pod, "spoke")
    csi, registrar = (_named(pod, n) for n in ("csi", "node-driver-registrar"))
    assert csi["command"] == ["strata-csi"] and csi["args"][0] == "serve"
    assert csi["securityContext"]["privileged"] is True, "Bidirectional needs privileged"
    # the mount: the spoke mounts on --mount inside a root it shares with the node; the
    # plugin's --mount is the same path on the same node directory, seen HostToContainer
    mountpoint = _flag(csi["args"], "--mount")
    assert mountpoint == _flag(spoke["args"], "--mount")
    spoke_root, spoke_root_volume = _mount_for(spoke, spoke_pod, mountpoint)
    csi_root, csi_root_volume = _mount_for(csi, pod, mountpoint)
    assert spoke_root["mountPropagation"] == "Bidirectional", "the node must see the spoke's mount"
    assert csi_root["mountPropagation"] == "HostToContainer", "it must see the spoke's mount"
    assert "readOnly" not in csi_root, "a read-only hostPath would not propagate new mounts"
    assert csi_root_volume == spoke_root_volume, "the same node directory, the same type"
    assert _node_path(csi, pod, mountpoint) == _node_path(spoke, spoke_pod, mountpoint)
    assert csi_root["mountPath"] != mountpoint, "a root above the mount: it survives remounts"
    pods_mount, pods_volume = _mount_for(csi, pod, "/var/lib/kubelet/pods/uid/volumes")
    assert pods_mount["mountPropagation"] == "Bidirectional"
    assert pods_volume["hostPath"]["path"] == pods_mount["mountPath"] == "/var/lib/kubelet/pods"
    # nothing of the plugin is left in the spoke's pod
    spoke_volumes = {v["name"]: v for v in spoke_pod["volumes"]}
    assert not any(
        v.get("hostPath", {}).get("path", "").startswith("/var/lib/kubelet")
        for v in spoke_volumes.values()
    )
    assert "strata-csi-tenancy" not in str(spoke_pod)
    # the socket: csi serves it, the registrar dials it, the kubelet is told its node path
    socket = _flag(csi["args"], "--endpoint").removeprefix("unix://")
    assert _flag(registrar["args"], "--csi-address") == socket
    sock_mount, sock_volume = _mount_for(csi, pod, socket)
    assert _mount_for(registrar, pod, socket)[1] is sock_volume
    node_socket = _node_path(csi, pod, socket)
    assert _flag(registrar["args"], "--kubelet-registration-path") == node_socket
    (driver,) = [o for o in gpu.values() if o["kind"] == "CSIDriver"]
    name = driver["metadata"]["name"]
    assert node_socket == f"/var/lib/kubelet/plugins/{name}/csi.sock"
    assert "namespace" not in driver["metadata"], "a CSIDriver is cluster-scoped"
    assert driver["spec"]["attachRequired"] is False
    assert driver["spec"]["podInfoOnMount"] is True
    assert driver["spec"]["volumeLifecycleModes"] == ["Ephemeral"]
    assert driver["spec"]["fsGroupPolicy"] == "None", "the kubelet must not chown a snapshot"
    # its records of published volumes on the node, beside its socket: a new plugin pod
    # finds what the old one published
    state = _flag(csi["args"], "--state-dir")
    assert state.startswith(sock_mount["mountPath"] + "/")
    assert _node_path(csi, pod, state).startswith(f"/var/lib/kubelet/plugins/{name}/")
    env = {e["name"]: e for e in csi["env"]}
    assert _flag(csi["args"], "--node-id") == "$(NODE_NAME)"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    tenancy_mount, tenancy = _mount_for(csi, pod, _flag(csi["args"], "--tenancy"))
    assert tenancy["configMap"]["name"] == "strata-csi-tenancy" and tenancy_mount["readOnly"]
    assert ("ConfigMap", "strata", "strata-csi-tenancy") in gpu
    registration = _mount_for(registrar, pod, "/registration/x")[1]
    assert registration["hostPath"]["path"] == "/var/lib/kubelet/plugins_registry"
    assert registrar["securityContext"].get("privileged") is not True
    assert registrar["securityContext"]["allowPrivilegeEscalation"] is False
    assert registrar["securityContext"]["capabilities"]["drop"] == ["ALL"]
    for container in (csi, registrar):
        assert "livenessProbe" in container and "readinessProbe" in container, container["name"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"cpu", "memory"} <= set(container["resources"]["limits"]), container["name"]
        assert {"cpu", "memory"} <= set(container["resources"]["requests"]), container["name"]
    probe = csi["livenessProbe"]["exec"]["command"]
    assert probe[:2] == ["strata-csi", "probe"] and _flag(probe, "--endpoint") == f"unix://{socket}"
    # a volume's own token is checked at the spoke's hub, with the spoke's TLS files (the
    # hub requires a client certificate), but never the spoke's own hub token
    spoke_env = {e["name"]: e.get("value") for e in spoke["env"]}
    csi_values = {e["name"]: e.get("value") for e in csi["env"]}
    for flag in ("--hub", "--hub-server-name"):
        assert _flag(csi["args"], flag) == _flag(spoke["args"], flag), flag
        variable = _flag(csi["args"], flag).removeprefix("$(").removesuffix(")")
        assert csi_values[variable] == spoke_env[variable], f"the overlay sets {variable} in both"
    assert csi_values["STRATA_HUB"].startswith("hub.region-a."), "the overlay's, not the base's"
    for flag in ("--hub-ca", "--hub-cert", "--hub-key"):
        path = _flag(csi["args"], flag)
        assert path == _flag(spoke["args"], flag), flag
        mount, volume = _mount_for(csi, pod, path)
        assert mount["readOnly"] is True
        assert (
            volume["secret"]["secretName"]
            == _mount_for(spoke, spoke_pod, path)[1]["secret"]["secretName"]
        )
        items = {i["key"]: i["path"] for i in volume["secret"]["items"]}
        assert items[path.rpartition("/")[2]] == path.rpartition("/")[2]
        assert "token" not in items, "the node's hub token is the spoke's alone"
    assert "--hub-insecure" not in str(csi["args"])


def test_resource_alerts_cover_the_plugins_pods(
    objects: dict[str, dict[tuple[str, str, str], Obj]],
) -> None:
    """The memory, restart and OOM rules (and the dashboard's resource panels) pick pods by
    name, ``strata-(hub|spoke)-.+``: the DaemonSet's name, strata-spoke-csi, keeps its
    pods (csi, node-driver-registrar) under them; the example Jobs are not Strata's."""
    patterns = set(re.findall(r'pod=~"([^"]+)"', RULES.read_text()))
    assert patterns, "the rules pick no pods by name"
    for key, obj in objects["gpu-region"].items():
        if obj["kind"] == "DaemonSet":
            pod_name = f"{key[2]}-x7k2p"  # a DaemonSet's pods: its name, a dash, a suffix
            for pattern in patterns:
                assert re.fullmatch(pattern, pod_name), (pattern, pod_name)
    assert not re.fullmatch(next(iter(patterns)), "strata-csi-node-x7k2p")


def test_the_plugin_sees_the_spoke_mount_through_the_node(
    objects: dict[str, dict[tuple[str, str, str], Obj]],
) -> None:
    """The checks above can fail: a plugin pod whose root is another node directory, or
    whose --mount is not the spoke's, or that does not receive the node's mounts."""
    spoke_pod = _spoke(objects)["spec"]["template"]["spec"]
    spoke = _named(spoke_pod, "spoke")
    mountpoint = _flag(spoke["args"], "--mount")
    pod = copy.deepcopy(_csi_plugin(objects)["spec"]["template"]["spec"])
    csi = _named(pod, "csi")
    mount, volume = _mount_for(csi, pod, mountpoint)
    assert _node_path(csi, pod, mountpoint) == _node_path(spoke, spoke_pod, mountpoint)
    volume["hostPath"]["path"] = "/mnt/other"
    assert _node_path(csi, pod, mountpoint) != _node_path(spoke, spoke_pod, mountpoint)
    volume["hostPath"]["path"] = "/mnt/strata"
    mount["mountPath"] = "/strata"
    assert _node_path(csi, pod, "/strata/data") == _node_path(spoke, spoke_pod, mountpoint)
    with pytest.raises(AssertionError):
        _mount_for(csi, pod, mountpoint)  # the plugin's --mount is on no volume now


def test_network_policies_name_every_destination(
    objects: dict[str, dict[tuple[str, str, str], Obj]],
) -> None:
    """In the GPU region no egress rule is open to every destination: the spokes reach
    the hub's address (the overlay's ipBlock, the same ports as the hub's Service), each
    other and the cluster's DNS; strata-spoke-csi the hub (the same policy) and DNS, and
    nothing reaches it; the example Job only DNS; each selects its pods."""
    gpu = {**objects["gpu-region"], **objects["train"]}
    policies = [o for o in gpu.values() if o["kind"] == "NetworkPolicy"]
    names = {p["metadata"]["name"] for p in policies}
    assert names == {"strata-spoke", "strata-spoke-hub", "strata-spoke-csi", "strata-train-f3"}
    for policy in policies:
        for rule in policy["spec"]["egress"]:
            assert rule.get("to"), f"{policy['metadata']['name']}: egress to anywhere: {rule}"
    env = {
        e["name"]: e for e in _named(_spoke(objects)["spec"]["template"]["spec"], "spoke")["env"]
    }
    hub_port = int(env["STRATA_HUB"]["value"].rpartition(":")[2])
    spoke_labels, csi_labels = pod_labels(_spoke(objects)), pod_labels(_csi_plugin(objects))
    for labels in (spoke_labels, csi_labels):
        # the policies that select these pods: one rule to the hub, none to anywhere else
        (hub_rule,) = [
            r
            for p in policies
            if _selects(p["spec"]["podSelector"], labels)
            for r in p["spec"]["egress"]
            if {"port": hub_port, "protocol": "TCP"} in r["ports"]
        ]
        (block,) = hub_rule["to"]
        assert block["ipBlock"]["cidr"].endswith("/32"), "the hub's address, not a range"
    by_name = {p["metadata"]["name"]: p for p in policies}
    assert _selects(by_name["strata-spoke"]["spec"]["podSelector"], spoke_labels)
    assert not _selects(by_name["strata-spoke"]["spec"]["podSelector"], csi_labels)
    assert _selects(by_name["strata-spoke-hub"]["spec"]["podSelector"], spoke_labels)
    csi_policy = by_name["strata-spoke-csi"]
    assert _selects(csi_policy["spec"]["podSelector"], csi_labels)
    assert not _selects(csi_policy["spec"]["podSelector"], spoke_labels)
    assert csi_policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert csi_policy["spec"]["ingress"] == []
    assert {p["port"] for r in csi_policy["spec"]["egress"] for p in r["ports"]} == {53}
    job = _job(objects, "train")
    train = next(p for p in policies if p["metadata"]["name"] == "strata-train-f3")
    assert train["spec"]["podSelector"]["matchLabels"].items() <= pod_labels(job).items()
    assert train["spec"]["ingress"] == []


def _selects(selector: Obj, labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels, matchExpressions with In) selects ``labels``."""
    assert set(selector) <= {"matchLabels", "matchExpressions"}, selector
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def test_training_job_reads_a_csi_volume(
    objects: dict[str, dict[tuple[str, str, str], Obj]],
) -> None:
    """overlays/train: the Job reads one version of f3 through a read-only CSI ephemeral
    inline volume of the spokes' driver, from a namespace of its own, no hostPath."""
    (driver,) = [o for o in objects["gpu-region"].values() if o["kind"] == "CSIDriver"]
    job = _job(objects, "train")
    assert job["metadata"]["namespace"] != "strata", "jobs run outside the spokes' namespace"
    pod = job["spec"]["template"]["spec"]
    (train,) = pod["containers"]
    assert train["command"] == ["torchrun"]
    data = _flag(train["args"], "--data")
    mount, volume = _mount_for(train, pod, data)
    assert mount.get("readOnly") is True
    assert volume["csi"]["driver"] == driver["metadata"]["name"]
    assert volume["csi"]["readOnly"] is True, "strata-csi refuses a read-write publish"
    attributes = volume["csi"]["volumeAttributes"]
    assert set(attributes) == {"dataset", "ref"}
    assert data == f"{mount['mountPath']}/f3.mdio" and attributes["dataset"] == "f3"
    assert not any("hostPath" in v for v in pod["volumes"])
    assert "privileged" not in train.get("securityContext", {})


def test_hostpath_variant_reads_the_mount(
    objects: dict[str, dict[tuple[str, str, str], Obj]],
) -> None:
    """overlays/train-hostpath: the same Job over the node's mount by hostPath,
    HostToContainer, in the spokes' namespace."""
    spoke_pod = _spoke(objects)["spec"]["template"]["spec"]
    spoke = _named(spoke_pod, "spoke")
    spoke_mount = _flag(spoke["args"], "--mount")
    root_mount, root_volume = _mount_for(spoke, spoke_pod, spoke_mount)
    job = _job(objects, "train-hostpath")
    assert job["metadata"]["namespace"] == "strata"
    pod = job["spec"]["template"]["spec"]
    (train,) = pod["containers"]
    data = _flag(train["args"], "--data")
    mount, volume = _mount_for(train, pod, data)
    assert mount["mountPropagation"] == "HostToContainer"
    assert mount.get("readOnly") is True
    assert volume["hostPath"]["path"] == root_volume["hostPath"]["path"]
    # the same file, seen from the node: under the spoke's mountpoint
    node_path = root_volume["hostPath"]["path"] + data.removeprefix(mount["mountPath"])
    spoke_node_mount = root_volume["hostPath"]["path"] + spoke_mount.removeprefix(
        root_mount["mountPath"]
    )
    assert node_path.startswith(spoke_node_mount + "/")
    assert "privileged" not in train.get("securityContext", {})
    # the rest of the Job is the CSI one's
    csi_job = copy.deepcopy(_job(objects, "train"))
    hostpath_job = copy.deepcopy(job)
    for one in (csi_job, hostpath_job):
        del one["metadata"]["namespace"], one["metadata"]["labels"]["app.kubernetes.io/instance"]
        spec = one["spec"]["template"]["spec"]
        spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "strata"]
        container = spec["containers"][0]
        container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "strata"]
        container["args"] = [a for a in container["args"] if not a.startswith("--data=")]
    assert hostpath_job == csi_job


def test_hub_statefulset(objects: dict[str, dict[tuple[str, str, str], Obj]]) -> None:
    hub_objects = objects["hub-region"]
    deployment = hub_objects[("StatefulSet", "strata", "strata-hub")]
    assert deployment["spec"]["replicas"] == 3, "replicas over one shared catalog"
    assert deployment["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    pod = deployment["spec"]["template"]["spec"]
    (hub,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in hub["env"]}
    assert env["STRATA_HUB_BLOBS"].startswith("s3://")
    catalog = _catalog_url(env["STRATA_HUB_CATALOG"])
    assert catalog["user"] == "strata_serve" and catalog["host"].startswith("catalog.region-a")
    assert catalog["password"] is None, "no password in the URL"
    assert not any("valueFrom" in e for e in hub["env"]) and "envFrom" not in hub, "no secret env"
    for variable, key in (
        ("PGPASSFILE", "pgpass"),
        ("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
        ("AWS_CONFIG_FILE", "config"),
    ):
        mount, volume = _mount_for(hub, pod, env[variable])
        assert volume["secret"]["defaultMode"] == 0o440, variable
        assert env[variable] == f"{mount['mountPath']}/{key}"
        assert key in hub_objects[("Secret", "strata", volume["secret"]["secretName"])]["data"]
    assert hub["resources"]["limits"]["cpu"] == "2"
    grant, _ = _mount_for(hub, pod, _flag(hub["args"], "--grant-key"))
    assert grant["readOnly"]
    ready = hub["readinessProbe"]["httpGet"]
    assert ready["path"] == "/readyz" and ready["port"] == "metrics", "catalog reachability"
    # the replica's own files (its audit log) on a volume of its own that outlives the pod
    data_dir = _flag(hub["args"], "--data-dir")
    (data,) = [m for m in hub["volumeMounts"] if m["mountPath"] == data_dir]
    (claim,) = deployment["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == data["name"]
    assert data["name"] not in {v["name"] for v in pod["volumes"]}, "the claim's, not a volume"
    retention = deployment["spec"]["persistentVolumeClaimRetentionPolicy"]
    assert retention == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    secrets |= {e["secretRef"]["name"] for e in hub.get("envFrom", [])}
    for name in secrets:
        assert ("Secret", "strata", name) in hub_objects, f"Secret {name} is not generated"
    tls = next(v for v in pod["volumes"] if v["name"] == "tls")
    files = hub_objects[("Secret", "strata", tls["secret"]["secretName"])]["data"]
    tls_mount, _ = _mount_for(hub, pod, _flag(hub["args"], "--tls-cert"))
    for flag in ("--tls-cert", "--tls-key", "--client-ca"):
        assert _flag(hub["args"], flag).removeprefix(tls_mount["mountPath"] + "/") in files
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert probe in hub
    service = hub_objects[("Service", "strata", "strata-hub")]
    ports = {p["name"] for p in hub["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    pdb = hub_objects[("PodDisruptionBudget", "strata", "strata-hub")]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels(deployment).items()
    assert pdb["spec"]["maxUnavailable"] == 1


def _catalog_url(url: str) -> dict[str, Any]:
    """A postgresql:// URL's parts: user, password, host, port, database and parameters."""
    parts = urllib.parse.urlsplit(url)
    assert parts.scheme == "postgresql", url
    return {
        "user": parts.username,
        "password": parts.password,
        "host": parts.hostname,
        "port": parts.port,
        "database": parts.path.lstrip("/"),
        "params": dict(urllib.parse.parse_qsl(parts.query)),
    }


def _secret_file(objects: dict[tuple[str, str, str], Obj], name: str, key: str) -> bytes:
    return base64.b64decode(objects[("Secret", "strata", name)]["data"][key])


def test_hub_tokens_are_managed_hashed_and_expiring(
    objects: dict[str, dict[tuple[str, str, str], Obj]],
) -> None:
    """The hub's token Secret is a managed file (strata-hub token create): only SHA-256
    hashes, every token expiring, and the spokes' hub-token is one of them."""
    hub_objects = objects["hub-region"]
    pod = hub_objects[("StatefulSet", "strata", "strata-hub")]["spec"]["template"]["spec"]
    (hub,) = pod["containers"]
    mount, volume = _mount_for(hub, pod, _flag(hub["args"], "--tokens"))
    key = _flag(hub["args"], "--tokens").removeprefix(mount["mountPath"] + "/")
    text = _secret_file(hub_objects, volume["secret"]["secretName"], key)
    table = yaml.safe_load(text)
    assert table["version"] == MANAGED_VERSION
    assert table["tokens"], "no tokens"
    for token_id, entry in table["tokens"].items():
        assert re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]), token_id
        assert entry["expires"] is not None, f"{token_id} never expires"
    spoke_token = _secret_file(objects["gpu-region"], "strata-spoke-hub", "token").strip()
    assert spoke_token not in text  # the secret itself is nowhere in the hub's file
    digests = {entry["sha256"] for entry in table["tokens"].values()}
    assert hashlib.sha256(spoke_token).hexdigest() in digests


def pod_labels(obj: Obj) -> dict[str, str]:
    labels: dict[str, str] = obj["spec"]["template"]["metadata"]["labels"]
    return labels


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
