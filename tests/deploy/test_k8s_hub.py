"""deploy/k8s, the hub region as rendered: the hub StatefulSet (catalog, blobs, secrets as
files, probes, its own volume, the disruption budget) and its managed, hashed, expiring
token file."""

from __future__ import annotations

import base64
import hashlib
import re
import urllib.parse
from typing import Any

import yaml

from hub.auth.tokens import MANAGED_VERSION
from tests.deploy.k8s_support import (
    Obj,
    flag_value,
    k8s_fixture,  # noqa: F401  (the k8s fixture)
    mount_for,
    objects_fixture,  # noqa: F401  (the objects fixture)
    pod_labels,
)


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
        mount, volume = mount_for(hub, pod, env[variable])
        assert volume["secret"]["defaultMode"] == 0o440, variable
        assert env[variable] == f"{mount['mountPath']}/{key}"
        assert key in hub_objects[("Secret", "strata", volume["secret"]["secretName"])]["data"]
    assert hub["resources"]["limits"]["cpu"] == "2"
    grant, _ = mount_for(hub, pod, flag_value(hub["args"], "--grant-key"))
    assert grant["readOnly"]
    ready = hub["readinessProbe"]["httpGet"]
    assert ready["path"] == "/readyz" and ready["port"] == "metrics", "catalog reachability"
    # the replica's own files (its audit log) on a volume of its own that outlives the pod
    data_dir = flag_value(hub["args"], "--data-dir")
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
    tls_mount, _ = mount_for(hub, pod, flag_value(hub["args"], "--tls-cert"))
    for flag in ("--tls-cert", "--tls-key", "--client-ca"):
        assert flag_value(hub["args"], flag).removeprefix(tls_mount["mountPath"] + "/") in files
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
    mount, volume = mount_for(hub, pod, flag_value(hub["args"], "--tokens"))
    key = flag_value(hub["args"], "--tokens").removeprefix(mount["mountPath"] + "/")
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
