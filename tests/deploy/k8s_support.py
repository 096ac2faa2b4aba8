"""Render deploy/k8s overlays for tests: secrets made fresh, kubectl where present; the
rendered overlays as module fixtures (import ``k8s_fixture`` and ``objects_fixture``) and
the readers of a workload that ``test_k8s*.py`` share; pods played in mount namespaces."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.kustomize import render
from deploy.pki import LocalCa
from tests.conftest import REPO_ROOT

K8S = REPO_ROOT / "deploy" / "k8s"
OVERLAYS = ("hub-region", "hub-publish", "gpu-region", "train", "train-hostpath")

Obj = dict[str, Any]

HUB_ADDRESS = "203.0.113.10/32"
"""What the tests write into overlays/gpu-region/hub-egress.yaml for SET-ME, as an
operator writes the hub load balancer's address (a documentation address here)."""


def create_hub_token(tokens: Path) -> str:
    """``strata-hub token create`` exactly as docs/deploy.md runs it (a managed, hashed,
    30-day token for f3 and f3-*); returns the secret it prints once."""
    scope = ["--dataset", "f3", "--dataset", "f3-*", "--expires", "30d"]
    done = subprocess.run(
        [sys.executable, "-m", "hub", "token", "create", "--tokens", str(tokens), *scope],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout.strip()


def make_secrets(root: Path) -> None:
    """The secret files each overlay's secretGenerator reads, as an operator makes them
    (docs/deploy.md): a CA, the hub's server certificate, a spoke client certificate,
    a managed token file with the spoke's token, S3 and catalog credentials for serve and
    for publish, the catalog's CA, and the spokes' egress to the hub (hub-egress.yaml)."""
    pki = root / "pki"
    pki.mkdir()
    ca = LocalCa(pki, "strata-ca")
    hub, spoke = ca.issue("hub"), ca.issue("spoke")
    token = create_hub_token(pki / "tokens.yaml")
    admin = "fedcba9876543210fedcba9876543210"
    secrets = root / "overlays" / "hub-region" / "secrets"
    secrets.mkdir()
    shutil.copy(hub.cert, secrets / "hub.crt")
    shutil.copy(hub.key, secrets / "hub.key")
    shutil.copy(ca.pem.cert, secrets / "ca.crt")
    shutil.copy(pki / "tokens.yaml", secrets / "tokens.yaml")
    for role in ("serve", "publish"):
        (secrets / f"s3-{role}-credentials").write_text(
            f"[default]\naws_access_key_id = strata-{role}\n"
            "aws_secret_access_key = not-a-real-key\n"
        )
        (secrets / f"pgpass-{role}").write_text(
            f"catalog.region-a.example.internal:5432:strata:strata_{role}:not-a-password\n"
        )
    (secrets / "s3-config").write_text("[default]\nregion = a\n")
    catalog_ca = LocalCa(pki, "catalog-ca")
    shutil.copy(catalog_ca.pem.cert, secrets / "catalog-ca.crt")
    keygen = [sys.executable, "-m", "hub", "keygen", str(secrets / "grant.key")]
    subprocess.run([*keygen, str(secrets / "grant.pub")], check=True, capture_output=True)
    gpu = root / "overlays" / "gpu-region"
    (gpu / "hub-egress.yaml").write_text(
        (gpu / "hub-egress.example.yaml").read_text().replace("SET-ME/32", HUB_ADDRESS)
    )
    secrets = gpu / "secrets"
    secrets.mkdir()
    shutil.copy(ca.pem.cert, secrets / "ca.crt")
    shutil.copy(spoke.cert, secrets / "spoke.crt")
    shutil.copy(spoke.key, secrets / "spoke.key")
    (secrets / "hub-token").write_text(token + "\n")
    (secrets / "admin-token").write_text(admin + "\n")
    (secrets / "peer-token").write_text("00112233445566778899aabbccddeeff\n")
    # the mesh: its own CA and one certificate for every spoke of the region, server and
    # client use, naming the peers' Service (deploy.pki's, as docs/deploy.md makes it)
    peer_ca = LocalCa(pki, "peer-ca")
    peer = peer_ca.issue("peer", dns=("strata-spoke-peers.strata.svc",), ips=())
    shutil.copy(peer_ca.cert, secrets / "peer-ca.crt")
    shutil.copy(peer.cert, secrets / "peer.crt")
    shutil.copy(peer.key, secrets / "peer.key")


def copy_tree(tmp: Path) -> Path:
    """deploy/k8s copied to ``tmp`` with its secret files made; returns the copy."""
    root = tmp / "k8s"
    shutil.copytree(K8S, root, ignore=shutil.ignore_patterns("secrets", "hub-egress.yaml"))
    make_secrets(root)
    return root


def kubectl_render(directory: Path) -> list[Obj] | None:
    """``kubectl kustomize DIRECTORY`` parsed, or None when kubectl is not installed."""
    if shutil.which("kubectl") is None:
        return None
    out = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def by_key(objects: list[Obj]) -> dict[tuple[str, str, str], Obj]:
    """Objects by (kind, namespace, name); fails on duplicates."""
    out: dict[tuple[str, str, str], Obj] = {}
    for obj in objects:
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in out, f"duplicate object {key}"
        out[key] = obj
    return out


def rendered(root: Path, overlay: str) -> list[Obj]:
    """The overlay's objects: the Python renderer's (the same as kubectl's, tested)."""
    return render(root / "overlays" / overlay)


# -- the rendered overlays, and what the test_k8s*.py files read of them ----------------


@pytest.fixture(scope="module", name="k8s")
def k8s_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy/k8s copied with fresh secrets, once per test module."""
    return copy_tree(tmp_path_factory.mktemp("deploy"))


@pytest.fixture(scope="module", name="objects")
def objects_fixture(k8s: Path) -> dict[str, dict[tuple[str, str, str], Obj]]:
    """Every overlay rendered from the ``k8s`` copy: overlay -> objects by key."""
    return {overlay: by_key(rendered(k8s, overlay)) for overlay in OVERLAYS}


def spoke_daemonset(objects: dict[str, dict[tuple[str, str, str], Obj]]) -> Obj:
    """The gpu-region overlay's spoke DaemonSet."""
    return objects["gpu-region"][("DaemonSet", "strata", "strata-spoke")]


def flag_value(args: list[str], name: str) -> str:
    """The value of ``--NAME=VALUE`` in ``args``; fails unless given exactly once."""
    values = [a.partition("=")[2] for a in args if a.startswith(f"{name}=")]
    assert len(values) == 1, f"{name} given {len(values)} times in {args}"
    return values[0]


def mount_for(container: Obj, pod: Obj, path: str) -> tuple[Obj, Obj]:
    """The volumeMount holding ``path`` (the deepest) and its volume."""
    mounts = [m for m in container["volumeMounts"] if (path + "/").startswith(m["mountPath"] + "/")]
    assert mounts, f"{path} is on no volume: it would be in the container's overlay"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    return mount, volume


def pod_labels(obj: Obj) -> dict[str, str]:
    """The labels of a workload's pod template."""
    labels: dict[str, str] = obj["spec"]["template"]["metadata"]["labels"]
    return labels


# -- mount propagation, played with Linux mount namespaces ------------------------------

needs_namespaces = pytest.mark.skipif(
    shutil.which("unshare") is None or shutil.which("nsenter") is None,
    reason="needs unshare and nsenter (util-linux)",
)
"""For modules whose tests play pods with :func:`play_pods`."""

PROPAGATION = {
    "Bidirectional": "--make-rshared",
    "HostToContainer": "--make-rslave",
    None: "--make-rprivate",
}
"""What the container runtime does to a hostPath's bind for each mountPropagation."""

POD_FUNCTIONS = r"""
pids=""
trap 'for p in $pids; do kill $p 2>/dev/null || true; done' EXIT
pod() {  # a pod's mount namespace: a process holding it; prints its pid
    unshare -m --propagation unchanged sleep 600 >/dev/null 2>&1 &
    echo $!
}
in_pod() { p=$1; shift; nsenter -t "$p" -m -- sh -c "$*"; }
wait_ns() {  # until the pod's process has its own namespace
    for _ in $(seq 50); do
        [ "$(readlink /proc/$1/ns/mnt)" != "$(readlink /proc/self/ns/mnt)" ] && return
        sleep 0.1
    done
    exit 9
}
check() { [ "$1" = "$2" ] || { echo "FAIL: $3: got '$1', wanted '$2'"; exit 1; }; }
"""
"""Shell functions for a play of pods on one node (``sh`` with ``set -eu``): ``pod``
starts a pod's namespace (killed on exit), ``in_pod PID CMD`` runs in it, ``wait_ns PID``
waits for it, ``check GOT WANTED WHAT`` ends the play with ``FAIL: WHAT`` unless equal."""


def pod_play(arguments: str, body: str) -> str:
    """A play's script: ``set -eu``, ``arguments`` (the line naming ``$1`` as ``N``, the
    node's directory, and the rest), :data:`POD_FUNCTIONS`, a tmpfs on ``$N``, ``body``."""
    return f'set -eu\n{arguments}\n{POD_FUNCTIONS}mount -t tmpfs node "$N"\n{body}'


def gpu_region(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], Obj]:
    """The gpu-region overlay as rendered, by (kind, namespace, name)."""
    return by_key(rendered(copy_tree(tmp_path_factory.mktemp("deploy")), "gpu-region"))


def play_pods(tmp_path: Path, script: str, *args: str) -> str:
    """Run ``script`` (``sh``, given ``tmp_path/node`` as ``$1`` and ``args`` after it)
    in a private mount namespace of its own, so nothing reaches this machine's mounts;
    returns what it printed. Skips where mount namespaces cannot be made."""
    node = tmp_path / "node"
    node.mkdir()
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "play", str(node),
         *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if "Operation not permitted" in done.stderr or "unshare failed" in done.stderr:
        pytest.skip(f"no mount namespaces here: {done.stderr.strip()[-200:]}")
    return done.stdout + done.stderr


def host_path_propagation(pod: Obj, container: Obj, host_path: str) -> str | None:
    """The mountPropagation ``container`` of ``pod`` (a pod spec) mounts ``host_path`` with."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [
        m
        for m in container["volumeMounts"]
        if volumes[m["name"]].get("hostPath", {}).get("path") == host_path
    ]
    value: str | None = mount.get("mountPropagation")
    return value
