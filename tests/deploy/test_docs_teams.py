"""docs/deploy.md's multi-team walk-through ("Many teams on one cluster") and systemd
section against what ships: the tenancy patch renders into the gpu-region overlay and is
the policy it says, the tenants' patches give the spoke a tenants file it parses where
``--tenants`` reads it, the per-tenant metrics it names are the spoke's, the pod is one
Pod Security ``restricted`` admits and the plugin reads, the refusal and the audit record
it quotes are the plugin's own words for that pod, and every flag its commands give is
one the command has."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from csi.service import ATTRIBUTES, KUBELET_PREFIX, Node
from csi.tenancy import Tenancy, parse
from csi.volumes import Denied
from deploy.kustomize import render
from deploy.local import LocalStack, admin_headers
from spoke import metrics as spoke_metrics
from spoke.cache.tenants import parse as parse_tenants
from strata_local.audit import AuditLog
from tests.conftest import REPO_ROOT
from tests.deploy.k8s_support import copy_tree, kubectl_render
from tests.support import fuse_available, publish

DOCS = REPO_ROOT / "docs" / "deploy.md"
K8S = REPO_ROOT / "deploy" / "k8s"
BINDIR = Path(sys.executable).parent


def _section(start: str, end: str) -> str:
    text = DOCS.read_text()
    return text[text.index(start) : text.index(end)]


def _walkthrough() -> str:
    return _section("### Many teams on one cluster\n", "### Threat model of the node\n")


def _blocks(text: str) -> list[tuple[str, str]]:
    """Fenced blocks as (language, dedented body)."""
    found = re.findall(r"^( *)```(\w*)\n(.*?)^\1```$", text, flags=re.MULTILINE | re.DOTALL)
    return [(lang, textwrap.dedent(body)) for _, lang, body in found]


def _yaml_block(containing: str) -> Any:
    (body,) = [b for lang, b in _blocks(_walkthrough()) if lang == "yaml" and containing in b]
    return yaml.safe_load(body)


def _policy_patch() -> dict[str, Any]:
    """The ``patches:`` entry the walk-through adds (``{patch: YAML}``)."""
    (entry,) = _yaml_block("name: strata-csi-tenancy")
    assert isinstance(entry, dict)
    return entry


def _policy() -> str:
    """The tenancy file the patch puts in the ConfigMap."""
    text: str = yaml.safe_load(_policy_patch()["patch"])["data"]["tenancy.yaml"]
    return text


def test_the_tenancy_patch_renders_into_the_overlay(tmp_path: Path) -> None:
    """Added to gpu-region's ``patches:`` as the walk-through says, it becomes the
    ConfigMap the csi container reads, with the two teams' entries."""
    root = copy_tree(tmp_path)
    kustomization = root / "overlays" / "gpu-region" / "kustomization.yaml"
    config = yaml.safe_load(kustomization.read_text())
    config["patches"].append(_policy_patch())
    kustomization.write_text(yaml.safe_dump(config, sort_keys=False))
    objects = kubectl_render(kustomization.parent) or render(kustomization.parent)
    (tenancy,) = [o for o in objects if o["metadata"]["name"] == "strata-csi-tenancy"]
    assert tenancy["kind"] == "ConfigMap" and tenancy["metadata"]["namespace"] == "strata"
    assert parse(tenancy["data"]["tenancy.yaml"]) == {"team-a": ("team-a",), "team-b": ("team-b",)}
    daemonsets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "DaemonSet"}
    plugins = daemonsets["strata-spoke-csi"]
    volumes = {v["name"]: v for v in plugins["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tenancy"]["configMap"]["name"] == "strata-csi-tenancy"


def _tenants_patches() -> list[dict[str, Any]]:
    """The two ``patches:`` entries of step 7: the tenants file, and the variable."""
    entries = _yaml_block("name: strata-spoke-tenants")
    assert isinstance(entries, list) and len(entries) == 2
    return entries


def test_the_tenants_patches_give_the_spoke_its_shares(tmp_path: Path) -> None:
    """Added to gpu-region's ``patches:`` as step 7 says, they fill the ConfigMap the spoke
    container mounts with a tenants file the spoke parses (the teams of the tenancy
    policy, over the same datasets), and point ``STRATA_SPOKE_TENANTS`` — the variable of
    ``strata-spoke run --tenants`` — at it, through a directory mount (not a subPath, so
    an edit reaches the running spoke)."""
    root = copy_tree(tmp_path)
    kustomization = root / "overlays" / "gpu-region" / "kustomization.yaml"
    config = yaml.safe_load(kustomization.read_text())
    config["patches"].extend(_tenants_patches())
    kustomization.write_text(yaml.safe_dump(config, sort_keys=False))
    objects = kubectl_render(kustomization.parent) or render(kustomization.parent)
    (configmap,) = [o for o in objects if o["metadata"]["name"] == "strata-spoke-tenants"]
    assert configmap["kind"] == "ConfigMap" and configmap["metadata"]["namespace"] == "strata"
    (spokes,) = [
        o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "strata-spoke"
    ]
    pod = spokes["spec"]["template"]["spec"]
    (spoke,) = [c for c in pod["containers"] if c["name"] == "spoke"]
    env = {e["name"]: e.get("value") for e in spoke["env"]}
    path = env["STRATA_SPOKE_TENANTS"]
    (mount,) = [m for m in spoke["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert "subPath" not in mount and mount.get("readOnly") is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == "strata-spoke-tenants"
    key = path.removeprefix(mount["mountPath"] + "/")
    tenants = parse_tenants(configmap["data"][key])
    policy = parse(_policy())
    assert set(tenants) == set(policy)
    for name, tenant in tenants.items():
        assert tenant.datasets == policy[name]
        assert tenant.cache_share > 0 and tenant.link_share > 0
    done = subprocess.run(
        [BINDIR / "strata-spoke", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    (line,) = [x for x in done.stdout.splitlines() if "--tenants " in x]
    flag_help = done.stdout[done.stdout.index(line) :].split("│ --", 2)[1]
    assert "$STRATA_SPOKE_TENANTS" in flag_help


def test_a_spoke_given_the_variable_keeps_the_shares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real spoke started with ``STRATA_SPOKE_TENANTS`` (and no flag) pointing at the
    file step 7 writes reports both teams' shares in ``GET /v1/cache``."""
    reason = fuse_available()
    if reason is not None:
        pytest.skip(reason)
    patch = yaml.safe_load(_tenants_patches()[0]["patch"])
    tenants_file = tmp_path / "tenants.yaml"
    tenants_file.write_text(patch["data"]["tenants.yaml"])
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("team a\n")
    assert publish(tmp_path / "hub", "team-a", src) == "v1"
    monkeypatch.setenv("STRATA_SPOKE_TENANTS", str(tenants_file))
    with LocalStack() as stack:
        hub = stack.start_hub(tmp_path / "hub")
        admin = stack.start_spoke(hub, tmp_path / "cache", tmp_path / "mnt", "64MiB")
        request = urllib.request.Request(
            f"{admin}/v1/cache", headers=admin_headers(tmp_path / "cache")
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            status = json.load(answer)
    shares = parse_tenants(patch["data"]["tenants.yaml"])
    assert set(status["tenants"]) == set(shares) == {"team-a", "team-b"}, status["tenants"]


def test_the_tenant_metrics_are_the_spokes() -> None:
    """Every ``strata_spoke_tenant_*`` the walk-through names is a metric the spoke
    exports (a counter with its ``_total``), and it names all three."""
    exported = set()
    for metric in vars(spoke_metrics).values():
        if isinstance(metric, MetricWrapperBase):
            name = metric._name
            exported.add(f"{name}_total" if metric._type == "counter" else name)
    named = set(re.findall(r"strata_spoke_tenant_\w+", _walkthrough()))
    assert named == {
        "strata_spoke_tenant_resident_bytes",
        "strata_spoke_tenant_admitted_bytes_total",
        "strata_spoke_tenant_reads_total",
    }
    assert named <= exported


def _pod() -> dict[str, Any]:
    pod = _yaml_block("kind: Pod")
    assert isinstance(pod, dict)
    return pod


def test_the_pod_is_restricted_and_asks_the_plugin_for_a_dataset() -> None:
    """Pod Security ``restricted``'s fields are set (so only the plugin can refuse it), its
    volume is the CSIDriver's with the attributes the plugin takes, and it goes where the
    spokes run."""
    pod = _pod()
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in spec["containers"]:
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert container["volumeMounts"][0]["readOnly"] is True
    (volume,) = spec["volumes"]
    driver = yaml.safe_load((K8S / "base" / "spoke" / "csidriver.yaml").read_text())
    assert volume["csi"]["driver"] == driver["metadata"]["name"]
    assert driver["spec"]["podInfoOnMount"] is True, "the namespace the policy needs"
    assert volume["csi"]["readOnly"] is True
    assert tuple(volume["csi"]["volumeAttributes"]) == ATTRIBUTES
    for name in ("daemonset.yaml", "csi-daemonset.yaml"):  # the spoke's and the plugin's
        daemonset = yaml.safe_load((K8S / "base" / "spoke" / name).read_text())
        assert spec["nodeSelector"] == daemonset["spec"]["template"]["spec"]["nodeSelector"]


def test_the_quoted_refusal_is_the_plugins(tmp_path: Path) -> None:
    """The event's ``desc`` and the audit record the walk-through shows are what
    strata-csi answers and records for that pod under that policy (the kubelet's
    ``csi.storage.k8s.io/*`` attributes, service account ``default``)."""
    policy = tmp_path / "tenancy.yaml"
    policy.write_text(_policy())
    node = Node(
        volumes=None,  # type: ignore[arg-type]  # refused before any volume is touched
        node_id="gpu-001",
        tenancy=Tenancy(policy),
        audit=AuditLog(tmp_path / "audit.jsonl"),
    )
    pod = _pod()
    context = {
        f"{KUBELET_PREFIX}pod.namespace": pod["metadata"]["namespace"],
        f"{KUBELET_PREFIX}pod.name": pod["metadata"]["name"],
        f"{KUBELET_PREFIX}serviceAccount.name": "default",
    }
    attributes = pod["spec"]["volumes"][0]["csi"]["volumeAttributes"]
    with pytest.raises(Denied) as refused:
        node._admit(context, {}, attributes["dataset"], attributes["ref"])
    walkthrough = _walkthrough()
    (event,) = [b for lang, b in _blocks(walkthrough) if "FailedMount" in b]
    volume = pod["spec"]["volumes"][0]["name"]
    assert f'MountVolume.SetUp failed for volume "{volume}"' in event
    assert event.strip().endswith(f"code = PermissionDenied desc = {refused.value}")
    (record,) = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    (quoted,) = re.findall(r"`(\{\"ts\":.*?\})`", walkthrough, flags=re.DOTALL)
    assert json.loads(quoted.replace('"…"', '"x"')) == {**record, "ts": "x"}
    # the same pod asking for its own team's dataset is admitted
    assert node._admit(context, {}, "team-b", "latest") == "team-b/reads-team-a"


COMMAND = re.compile(
    r"(?<![\w/.-])(strata-(?:hub|spoke|csi)) "  # the program, not part of a name or path
    r"((?:token )?[a-z][a-z-]*)"  # its subcommand
    r"((?: +[^ \n;|>)`]+)*)"  # its words, up to the end of the line or the command
)
"""``strata-X SUBCOMMAND ARGS`` as a command line or the prose writes it."""


def _commands() -> set[tuple[str, str, frozenset[str]]]:
    """(program, subcommand, flags) of every strata command in the walk-through, the
    systemd section and the pod-side admin note, code blocks and prose alike."""
    text = "\n".join(
        [
            _walkthrough(),
            _section("### Without Kubernetes (systemd)\n", "### Signed snapshots (optional)\n"),
            _section("5. Prewarm before the job", "6. Train."),
        ]
    ).replace("\\\n", " ")
    found = set()
    for match in COMMAND.finditer(text):
        if re.search(r"(systemctl \w+|journalctl -u) $", text[: match.start()]):
            continue  # the unit's name, not the program
        program, sub, args = match.groups()
        flags = frozenset(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", args))
        found.add((program, sub, flags))
    return found


def test_every_flag_is_the_commands() -> None:
    commands = _commands()
    programs = {(program, sub) for program, sub, _ in commands}
    assert ("strata-hub", "token create") in programs and ("strata-spoke", "status") in programs
    helps: dict[tuple[str, str], str] = {}
    for program, sub, flags in sorted(commands):
        if (program, sub) not in helps:
            done = subprocess.run(
                [BINDIR / program, *sub.split(), "--help"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
            )
            assert done.returncode == 0, f"{program} {sub}: {done.stderr}"
            helps[program, sub] = done.stdout
        for flag in flags:
            assert re.search(rf"{flag}(?![\w-])", helps[program, sub]), f"{program} {sub} {flag}"
