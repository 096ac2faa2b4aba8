"""deploy/k8s, the GPU region as rendered: the spoke DaemonSet (mount propagation, the
node's disk, probes, the drain, the mesh), the CSI plugin's DaemonSet beside it, their
NetworkPolicies and alert patterns, and the example training Jobs (CSI and hostPath)."""

from __future__ import annotations

import copy
import re

import pytest

from deploy.prometheusrule import RULES
from tests.deploy.k8s_support import (
    Obj,
    flag_value,
    k8s_fixture,  # noqa: F401  (the k8s fixture)
    mount_for,
    objects_fixture,  # noqa: F401  (the objects fixture)
    pod_labels,
    spoke_daemonset,
)


def _named(pod: Obj, name: str) -> Obj:
    (container,) = [c for c in pod["containers"] if c["name"] == name]
    return container


def test_spoke_daemonset(objects: dict[str, dict[tuple[str, str, str], Obj]]) -> None:
    pod = spoke_daemonset(objects)["spec"]["template"]["spec"]
    spoke = _named(pod, "spoke")
    (init,) = pod["initContainers"]
    args = spoke["args"]
    assert spoke["securityContext"]["privileged"] is True, "Bidirectional needs privileged"
    assert spoke["securityContext"]["runAsUser"] == 0, "the image's own user is not root"
    cache_mount, cache_volume = mount_for(spoke, pod, flag_value(args, "--cache-dir"))
    assert "hostPath" in cache_volume, "the cache must be on the node's own disk"
    assert "mountPropagation" not in cache_mount
    mountpoint = flag_value(args, "--mount")
    root_mount, root_volume = mount_for(spoke, pod, mountpoint)
    assert root_mount["mountPropagation"] == "Bidirectional"
    assert root_mount["mountPath"] != mountpoint, "mount below the shared root, not on it"
    assert root_volume["hostPath"]["path"] == "/mnt/strata"
    init_mount, init_volume = mount_for(init, pod, mountpoint)
    assert init_volume is root_volume and init_mount["mountPropagation"] == "Bidirectional"
    assert init["command"][-1].endswith(f"mkdir -p {mountpoint}"), "the spoke needs its mountpoint"
    # a surge pod's init runs beside the old pod: it detaches only a dead mount (stat fails)
    assert init["command"][-1].startswith(f"stat {mountpoint} >/dev/null 2>&1 || umount -l")
    # succession: the new pod takes the old one's connection; the old one idles until deleted
    assert "--take-over" in args and flag_value(args, "--after-succession") == "wait"
    _, fuse_volume = mount_for(spoke, pod, "/dev/fuse")
    assert fuse_volume["hostPath"] == {"path": "/dev/fuse", "type": "CharDevice"}
    assert spoke["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert spoke["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # the admin API (token, /v1/) only on the pod's loopback; the probes and Prometheus on
    # --metrics, which serves nothing else; no port of the node
    assert flag_value(args, "--admin").rpartition(":")[0] == "127.0.0.1"
    metrics_port = int(flag_value(args, "--metrics").rpartition(":")[2])
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
        metrics_port in admitted
        and int(flag_value(args, "--admin").rpartition(":")[2]) not in admitted
    )
    pre_stop = spoke["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[:3] == ["python3", "-m", "deploy.drain"]
    assert flag_value(pre_stop, "--mount") == mountpoint, "the drain watches the spoke's mount"
    assert pod["hostPID"] is True, "the drain must see the training pods' processes"
    assert float(flag_value(pre_stop, "--timeout")) < pod["terminationGracePeriodSeconds"]
    # a drain that has to wait cordons the node: its name, an expiring token of a service
    # account that may patch nodes and nothing else, in the spoke container only
    assert "--cordon" in pre_stop
    env = {e["name"]: e for e in spoke["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert pod["automountServiceAccountToken"] is False
    account = pod["serviceAccountName"]
    _, api_volume = mount_for(spoke, pod, "/var/run/secrets/kubernetes.io/serviceaccount/token")
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
    peer_port = int(flag_value(args, "--peer-listen").rpartition(":")[2])
    assert ports["peer"] == peer_port
    assert flag_value(args, "--peer-advertise") == f"$(POD_IP):{peer_port}"
    env = {e["name"]: e for e in spoke["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    service_name = flag_value(args, "--peers-dns").split(".")[0]
    (peers,) = [
        o for o in objects["gpu-region"].values()
        if o["kind"] == "Service" and o["metadata"]["name"] == service_name
    ]  # fmt: skip
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"]
    assert peers["spec"]["ports"][0]["port"] == peer_port
    assert peers["spec"]["selector"].items() <= pod_labels(spoke_daemonset(objects)).items()
    # the mesh runs mTLS with the region token: every file from the peer Secret, which the
    # overlay generates with exactly those keys; the name the certificate carries is the
    # peers' Service (pod IPs change), never the plaintext opt-out
    assert not any(a.startswith("--peer-insecure") for a in args)
    peer_flags = ("--peer-cert", "--peer-key", "--peer-ca", "--peer-token-file")
    mounts = {
        mount_for(spoke, pod, flag_value(args, f))[1]["secret"]["secretName"] for f in peer_flags
    }
    (secret_name,) = mounts
    secret = objects["gpu-region"][("Secret", "strata", secret_name)]
    (mount,) = [
        m for m in spoke["volumeMounts"] if flag_value(args, "--peer-ca").startswith(m["mountPath"])
    ]
    assert mount.get("readOnly") is True
    assert {flag_value(args, f).removeprefix(mount["mountPath"] + "/") for f in peer_flags} == set(
        secret["data"]
    )
    assert flag_value(args, "--peer-server-name") == f"{service_name}.$(POD_NAMESPACE).svc"


def _job(objects: dict[str, dict[tuple[str, str, str], Obj]], overlay: str) -> Obj:
    (job,) = [o for o in objects[overlay].values() if o["kind"] == "Job"]
    return job


def _csi_plugin(objects: dict[str, dict[tuple[str, str, str], Obj]]) -> Obj:
    return objects["gpu-region"][("DaemonSet", "strata", "strata-spoke-csi")]


def _node_path(container: Obj, pod: Obj, path: str) -> str:
    """``path`` of the container as the node sees it: through its hostPath volume."""
    mount, volume = mount_for(container, pod, path)
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
    spoke_set, csi_set = spoke_daemonset(objects), _csi_plugin(objects)
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
    mountpoint = flag_value(csi["args"], "--mount")
    assert mountpoint == flag_value(spoke["args"], "--mount")
    spoke_root, spoke_root_volume = mount_for(spoke, spoke_pod, mountpoint)
    csi_root, csi_root_volume = mount_for(csi, pod, mountpoint)
    assert spoke_root["mountPropagation"] == "Bidirectional", "the node must see the spoke's mount"
    assert csi_root["mountPropagation"] == "HostToContainer", "it must see the spoke's mount"
    assert "readOnly" not in csi_root, "a read-only hostPath would not propagate new mounts"
    assert csi_root_volume == spoke_root_volume, "the same node directory, the same type"
    assert _node_path(csi, pod, mountpoint) == _node_path(spoke, spoke_pod, mountpoint)
    assert csi_root["mountPath"] != mountpoint, "a root above the mount: it survives remounts"
    pods_mount, pods_volume = mount_for(csi, pod, "/var/lib/kubelet/pods/uid/volumes")
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
    socket = flag_value(csi["args"], "--endpoint").removeprefix("unix://")
    assert flag_value(registrar["args"], "--csi-address") == socket
    sock_mount, sock_volume = mount_for(csi, pod, socket)
    assert mount_for(registrar, pod, socket)[1] is sock_volume
    node_socket = _node_path(csi, pod, socket)
    assert flag_value(registrar["args"], "--kubelet-registration-path") == node_socket
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
    state = flag_value(csi["args"], "--state-dir")
    assert state.startswith(sock_mount["mountPath"] + "/")
    assert _node_path(csi, pod, state).startswith(f"/var/lib/kubelet/plugins/{name}/")
    env = {e["name"]: e for e in csi["env"]}
    assert flag_value(csi["args"], "--node-id") == "$(NODE_NAME)"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    tenancy_mount, tenancy = mount_for(csi, pod, flag_value(csi["args"], "--tenancy"))
    assert tenancy["configMap"]["name"] == "strata-csi-tenancy" and tenancy_mount["readOnly"]
    assert ("ConfigMap", "strata", "strata-csi-tenancy") in gpu
    registration = mount_for(registrar, pod, "/registration/x")[1]
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
    assert (
        probe[:2] == ["strata-csi", "probe"]
        and flag_value(probe, "--endpoint") == f"unix://{socket}"
    )
    # a volume's own token is checked at the spoke's hub, with the spoke's TLS files (the
    # hub requires a client certificate), but never the spoke's own hub token
    spoke_env = {e["name"]: e.get("value") for e in spoke["env"]}
    csi_values = {e["name"]: e.get("value") for e in csi["env"]}
    for flag in ("--hub", "--hub-server-name"):
        assert flag_value(csi["args"], flag) == flag_value(spoke["args"], flag), flag
        variable = flag_value(csi["args"], flag).removeprefix("$(").removesuffix(")")
        assert csi_values[variable] == spoke_env[variable], f"the overlay sets {variable} in both"
    assert csi_values["STRATA_HUB"].startswith("hub.region-a."), "the overlay's, not the base's"
    for flag in ("--hub-ca", "--hub-cert", "--hub-key"):
        path = flag_value(csi["args"], flag)
        assert path == flag_value(spoke["args"], flag), flag
        mount, volume = mount_for(csi, pod, path)
        assert mount["readOnly"] is True
        assert (
            volume["secret"]["secretName"]
            == mount_for(spoke, spoke_pod, path)[1]["secret"]["secretName"]
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
    spoke_pod = spoke_daemonset(objects)["spec"]["template"]["spec"]
    spoke = _named(spoke_pod, "spoke")
    mountpoint = flag_value(spoke["args"], "--mount")
    pod = copy.deepcopy(_csi_plugin(objects)["spec"]["template"]["spec"])
    csi = _named(pod, "csi")
    mount, volume = mount_for(csi, pod, mountpoint)
    assert _node_path(csi, pod, mountpoint) == _node_path(spoke, spoke_pod, mountpoint)
    volume["hostPath"]["path"] = "/mnt/other"
    assert _node_path(csi, pod, mountpoint) != _node_path(spoke, spoke_pod, mountpoint)
    volume["hostPath"]["path"] = "/mnt/strata"
    mount["mountPath"] = "/strata"
    assert _node_path(csi, pod, "/strata/data") == _node_path(spoke, spoke_pod, mountpoint)
    with pytest.raises(AssertionError):
        mount_for(csi, pod, mountpoint)  # the plugin's --mount is on no volume now


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
        e["name"]: e
        for e in _named(spoke_daemonset(objects)["spec"]["template"]["spec"], "spoke")["env"]
    }
    hub_port = int(env["STRATA_HUB"]["value"].rpartition(":")[2])
    spoke_labels, csi_labels = (
        pod_labels(spoke_daemonset(objects)),
        pod_labels(_csi_plugin(objects)),
    )
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
    data = flag_value(train["args"], "--data")
    mount, volume = mount_for(train, pod, data)
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
    spoke_pod = spoke_daemonset(objects)["spec"]["template"]["spec"]
    spoke = _named(spoke_pod, "spoke")
    spoke_mount = flag_value(spoke["args"], "--mount")
    root_mount, root_volume = mount_for(spoke, spoke_pod, spoke_mount)
    job = _job(objects, "train-hostpath")
    assert job["metadata"]["namespace"] == "strata"
    pod = job["spec"]["template"]["spec"]
    (train,) = pod["containers"]
    data = flag_value(train["args"], "--data")
    mount, volume = mount_for(train, pod, data)
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
