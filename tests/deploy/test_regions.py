"""Region A as region B reaches it (deploy/k8s): the hub behind a TLS-passthrough load
balancer on the port the spokes dial, the replicas reading with their own credentials
while gc and publish write with others, the same bucket and catalog everywhere, and the
spokes' egress to the hub a file the operator writes: no placeholder renders."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.kustomize import KustomizeError, render
from tests.conftest import REPO_ROOT
from tests.deploy.k8s_support import K8S, Obj, by_key, copy_tree, rendered

Objects = dict[tuple[str, str, str], Obj]


@pytest.fixture(scope="module")
def k8s(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_tree(tmp_path_factory.mktemp("regions"))


@pytest.fixture(scope="module")
def hub_region(k8s: Path) -> Objects:
    return by_key(rendered(k8s, "hub-region"))


def _pod(obj: Obj) -> Obj:
    spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
    pod: Obj = spec["template"]["spec"]
    return pod


def _env(container: Obj) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def _secrets(pod: Obj) -> set[str]:
    return {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}


def _spoke_env(k8s: Path) -> dict[str, str]:
    objects = by_key(rendered(k8s, "gpu-region"))
    pod = objects[("DaemonSet", "strata", "strata-spoke")]["spec"]["template"]["spec"]
    (spoke,) = [c for c in pod["containers"] if c["name"] == "spoke"]
    return _env(spoke)


def _spoke_args(k8s: Path) -> list[str]:
    objects = by_key(rendered(k8s, "gpu-region"))
    pod = objects[("DaemonSet", "strata", "strata-spoke")]["spec"]["template"]["spec"]
    (spoke,) = [c for c in pod["containers"] if c["name"] == "spoke"]
    return [str(a) for a in spoke["args"]]


def test_the_hub_is_exposed_by_a_passthrough_load_balancer(k8s: Path, hub_region: Objects) -> None:
    """One LoadBalancer Service, TCP on the ports the spokes dial, to the replicas' gRPC
    and bulk ports (the hub ends TLS itself on both), nothing else of theirs (metrics stay
    in-cluster)."""
    hub = hub_region[("StatefulSet", "strata", "strata-hub")]
    services = [o for o in hub_region.values() if o["kind"] == "Service"]
    (external,) = [s for s in services if s["spec"].get("type") == "LoadBalancer"]
    spec = external["spec"]
    assert spec["selector"].items() <= hub["spec"]["template"]["metadata"]["labels"].items()
    assert spec["externalTrafficPolicy"] == "Local"
    port, bulk = spec["ports"]
    for each in (port, bulk):
        assert each["protocol"] == "TCP" and "appProtocol" not in each, "L4, no L7 termination"
    (container,) = hub["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[port["targetPort"]] == 50051
    address = _spoke_env(k8s)["STRATA_HUB"]
    assert int(address.rpartition(":")[2]) == port["port"]
    # the bulk port: what the hub serves, and what the spokes dial
    assert f"--bulk-port={ports[bulk['targetPort']]}" in container["args"]
    assert f"--hub-bulk-port={bulk['port']}" in _spoke_args(k8s)
    # the ServiceMonitor scrapes the ClusterIP Service's metrics port, not this one
    (monitor,) = [o for o in hub_region.values() if o["kind"] == "ServiceMonitor"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= external["metadata"]["labels"].items()


def _catalog(url: str) -> dict[str, Any]:
    parts = urllib.parse.urlsplit(url)
    return {
        "user": parts.username,
        "password": parts.password,
        "server": (parts.hostname, parts.port, parts.path),
        "params": dict(urllib.parse.parse_qsl(parts.query)),
    }


def test_serve_reads_and_the_writers_write(k8s: Path, hub_region: Objects) -> None:
    """The replicas: the catalog as strata_serve, the bucket with strata-hub-s3 (the
    read-only key); gc and the example publish: strata_publish and the writer Secrets,
    which no replica mounts. All three: the same bucket, endpoint and catalog server,
    TLS verify-full against a CA that is in the Secret mounted where the URL says."""
    publish = by_key(rendered(k8s, "hub-publish"))
    workloads = {
        "serve": hub_region[("StatefulSet", "strata", "strata-hub")],
        "gc": hub_region[("CronJob", "strata", "strata-hub-gc")],
        "publish": publish[("Job", "strata", "strata-hub-publish-f3")],
    }
    shared = set()
    for role, obj in workloads.items():
        pod = _pod(obj)
        (container,) = pod["containers"]
        env = _env(container)
        catalog = _catalog(env["STRATA_HUB_CATALOG"])
        user = "strata_serve" if role == "serve" else "strata_publish"
        assert catalog["user"] == user and catalog["password"] is None, role
        assert catalog["params"]["sslmode"] == "verify-full", role
        shared.add((env["STRATA_HUB_BLOBS"], env["STRATA_HUB_S3_ENDPOINT"], catalog["server"]))
        writer = role != "serve"
        secrets = _secrets(pod)
        assert ("strata-hub-s3-writer" in secrets) is writer, role
        assert ("strata-hub-catalog-writer" in secrets) is writer, role
        assert ("strata-hub-s3" in secrets) is not writer, role
        for variable, key in (
            ("PGPASSFILE", "pgpass"),
            ("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
        ):
            directory, _, name = env[variable].rpartition("/")
            assert name == key
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
            assert mount.get("readOnly") is True
        ca_dir, _, ca_name = catalog["params"]["sslrootcert"].rpartition("/")
        assert ca_dir == env["PGPASSFILE"].rpartition("/")[0]
        (ca_mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == ca_dir]
        (ca_volume,) = [v for v in pod["volumes"] if v["name"] == ca_mount["name"]]
        catalog_secret = ca_volume["secret"]["secretName"]
        data = hub_region[("Secret", "strata", catalog_secret)]["data"]
        assert set(data) == {"pgpass", ca_name}, role
    assert len(shared) == 1, f"the three disagree: {shared}"
    # publish and gc keep their audit log on the admin volume, at their --data-dir
    for role in ("gc", "publish"):
        pod = _pod(workloads[role])
        (container,) = pod["containers"]
        (data_dir,) = [
            a.partition("=")[2] for a in container["args"] if a.startswith("--data-dir=")
        ]
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == data_dir]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["persistentVolumeClaim"]["claimName"] == "strata-hub-admin"
    assert ("PersistentVolumeClaim", "strata", "strata-hub-admin") in hub_region
    gc = workloads["gc"]["spec"]
    assert gc["concurrencyPolicy"] == "Forbid"
    assert _pod(workloads["gc"])["containers"][0]["args"][0] == "gc"
    assert _pod(workloads["publish"])["containers"][0]["args"][0] == "publish"


def test_the_hub_egress_must_be_written(k8s: Path, tmp_path: Path) -> None:
    """overlays/gpu-region does not render without hub-egress.yaml (kubectl neither, where
    installed), and the example it is made from names no address until SET-ME is
    replaced: the API server refuses a CIDR that is not one."""
    overlay = tmp_path / "k8s"
    shutil.copytree(k8s, overlay)
    (overlay / "overlays" / "gpu-region" / "hub-egress.yaml").unlink()
    with pytest.raises(KustomizeError, match=r"hub-egress\.yaml"):
        render(overlay / "overlays" / "gpu-region")
    if shutil.which("kubectl") is not None:
        done = subprocess.run(
            ["kubectl", "kustomize", str(overlay / "overlays" / "gpu-region")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode != 0 and "hub-egress.yaml" in done.stderr
    example = yaml.safe_load(
        (K8S / "overlays" / "gpu-region" / "hub-egress.example.yaml").read_text()
    )
    (rule,) = example["spec"]["egress"]
    (block,) = rule["to"]
    hub_port = _spoke_env(k8s)["STRATA_HUB"].rpartition(":")[2]
    assert {str(p["port"]) for p in rule["ports"]} == {hub_port, _bulk_port(k8s)}
    with pytest.raises(ValueError):
        ipaddress.ip_network(block["ipBlock"]["cidr"])
    if shutil.which("git") is not None:
        assert _ignored("deploy/k8s/overlays/gpu-region/hub-egress.yaml"), "never committed"


def _bulk_port(k8s: Path) -> str:
    """The hub bulk port the spokes dial (their ``--hub-bulk-port``)."""
    (flag,) = [a for a in _spoke_args(k8s) if a.startswith("--hub-bulk-port=")]
    return flag.partition("=")[2]


def _ignored(path: str) -> bool:
    done = subprocess.run(
        ["git", "check-ignore", "-q", path], cwd=REPO_ROOT, check=False, timeout=30
    )
    return done.returncode == 0


def test_the_cilium_example_names_the_hub(k8s: Path) -> None:
    """hub-egress-cilium.example.yaml allows the name and port STRATA_HUB gives, and DNS
    through Cilium's proxy (which is how it learns the name's addresses)."""
    host, _, port = _spoke_env(k8s)["STRATA_HUB"].rpartition(":")
    policy = yaml.safe_load(
        (K8S / "overlays" / "gpu-region" / "hub-egress-cilium.example.yaml").read_text()
    )
    assert policy["apiVersion"] == "cilium.io/v2" and policy["kind"] == "CiliumNetworkPolicy"
    assert policy["metadata"]["name"] == "strata-spoke-hub"
    dns, fqdn = policy["spec"]["egress"]
    assert dns["toPorts"][0]["rules"]["dns"]
    assert fqdn["toFQDNs"] == [{"matchName": host}]
    bulk = _bulk_port(k8s)
    assert fqdn["toPorts"][0]["ports"] == [
        {"port": port, "protocol": "TCP"},
        {"port": bulk, "protocol": "TCP"},
    ]
