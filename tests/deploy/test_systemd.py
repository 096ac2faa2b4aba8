"""deploy/systemd: both units pass `systemd-analyze verify` with nothing on stderr (a bad
value there is only a warning), are sandboxed (`systemd-analyze security --offline`),
and the spoke's sandbox keeps its mount visible to the host."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.deploy.systemd_support import directives, unit_files

UNITS = REPO_ROOT / "deploy" / "systemd"
EXPOSURE = {"strata-hub.service": 2.0, "strata-spoke.service": 5.0}
"""Highest exposure level each unit may have, on systemd's 0 (safe) to 10 scale."""
MOUNT_NAMESPACE = (
    "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "PrivateMounts",
    "ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths", "TemporaryFileSystem",
    "BindPaths", "BindReadOnlyPaths", "ProtectKernelTunables", "ProtectKernelModules",
    "ProtectKernelLogs", "ProtectControlGroups", "ProtectProc", "MountFlags",
)  # fmt: skip
"""Directives that give a service its own mount namespace (systemd.exec(5))."""

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)


@pytest.fixture(scope="module")
def units(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The units with /opt/strata/bin (where docs/deploy.md installs the venv) pointing at
    this venv: verify checks that every command it names exists and is executable."""
    out = tmp_path_factory.mktemp("systemd")
    for unit in UNITS.glob("*.service"):
        for path in unit_files(unit):  # drop-ins too: verify reads them from beside the unit
            text = path.read_text().replace("/opt/strata/bin/", f"{Path(sys.executable).parent}/")
            copy = out / path.relative_to(UNITS)
            copy.parent.mkdir(exist_ok=True)
            copy.write_text(text)
    return out


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_units_verify_cleanly(units: Path) -> None:
    names = sorted(str(p) for p in units.glob("*.service"))
    assert [Path(n).name for n in names] == sorted(EXPOSURE)
    result = _analyze("verify", "--man=no", *names)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_verify_reports_what_it_only_warns_about(units: Path, tmp_path: Path) -> None:
    """The check above can fail: a misspelt key and a bad value reach stderr (exit 0)."""
    text = (units / "strata-hub.service").read_text()
    bad = tmp_path / "strata-hub.service"
    bad.write_text(
        text.replace("NoNewPrivileges=yes", "NoNewPrivilege=yes").replace(
            "ProtectSystem=strict", "ProtectSystem=strickt"
        )
    )
    result = _analyze("verify", "--man=no", str(bad))
    assert "Unknown key 'NoNewPrivilege'" in result.stderr
    assert "strickt" in result.stderr


def test_verify_reads_the_drop_ins(units: Path, tmp_path: Path) -> None:
    """The hub's drop-ins are verified with it: a misspelt key in one reaches stderr."""
    shutil.copytree(units, tmp_path, dirs_exist_ok=True)
    conf = tmp_path / "strata-hub.service.d" / "catalog.conf"
    conf.write_text(conf.read_text().replace("LoadCredential=", "LoadCredentials=", 1))
    result = _analyze("verify", "--man=no", str(tmp_path / "strata-hub.service"))
    assert "catalog.conf" in result.stderr and "LoadCredentials" in result.stderr


@pytest.mark.parametrize("unit", sorted(EXPOSURE))
def test_units_are_sandboxed(units: Path, unit: str) -> None:
    threshold = round(EXPOSURE[unit] * 10)  # systemd compares tenths
    result = _analyze("security", "--offline=yes", f"--threshold={threshold}", str(units / unit))
    level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
    assert level, result.stdout[-500:] + result.stderr
    assert result.returncode == 0, f"{unit}: exposure {level.group(1)} > {EXPOSURE[unit]}"


def test_spoke_mount_reaches_the_host() -> None:
    spoke = directives(UNITS / "strata-spoke.service")
    assert not set(spoke) & set(MOUNT_NAMESPACE), "the FUSE mount would stay in the unit"
    assert spoke["DeviceAllow"] == ["/dev/fuse rw"] and spoke["DevicePolicy"] == ["closed"]
    (start,) = spoke["ExecStart"]
    (stop,) = spoke["ExecStop"]
    assert "--mount=${STRATA_MOUNT}" in start and "--mount=${STRATA_MOUNT}" in stop
    assert "deploy.drain" in stop, "stopping waits for open files first"
    hub = directives(UNITS / "strata-hub.service")
    assert hub["DynamicUser"] == ["yes"] and hub["ProtectSystem"] == ["strict"]
    assert "--data-dir=${STATE_DIRECTORY}" in hub["ExecStart"][0]


def _syscall_groups() -> dict[str, list[str]]:
    """Every ``@group`` systemd knows, with its members (``systemd-analyze syscall-filter``)."""
    out = _analyze("syscall-filter", "--no-pager").stdout
    groups: dict[str, list[str]] = {}
    members: list[str] = []
    for line in out.splitlines():
        if line.startswith("@"):
            members = groups.setdefault(line.strip(), [])
        elif line.strip() and not line.lstrip().startswith("#"):
            members.append(line.strip())
    assert "@system-service" in groups, out[:500]
    return groups


def _expand(names: list[str], groups: dict[str, list[str]]) -> set[str]:
    out: set[str] = set()
    for name in names:
        out |= _expand(groups[name], groups) if name.startswith("@") else {name}
    return out


def test_spoke_may_read_proc_but_not_trace() -> None:
    """The spoke keeps CAP_SYS_PTRACE so its drain sees other users' open files
    (test_drain.py); its system-call filter leaves it no way to read or write another
    process's memory or take its descriptors with it."""
    spoke = directives(UNITS / "strata-spoke.service")
    assert "CAP_SYS_PTRACE" in " ".join(spoke["CapabilityBoundingSet"]).split()
    groups = _syscall_groups()
    allowed: set[str] = set()
    for value in spoke["SystemCallFilter"]:  # an allow-list first, then what it removes
        if value.startswith("~"):
            allowed -= _expand(value[1:].split(), groups)
        else:
            allowed |= _expand(value.split(), groups)
    assert "openat" in allowed and "mount" in allowed
    tracing = {"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd"}
    assert not allowed & tracing, sorted(allowed & tracing)


CREDENTIAL_PATH = re.compile(r"(?:\$\{CREDENTIALS_DIRECTORY\}|%d)/([\w.-]+)")
"""A file of the credentials directory, as a command line or an environment names it."""
ENVIRONMENT_SECRETS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "PGPASSWORD",
)
"""Variables that would carry a secret in the environment."""


@pytest.mark.parametrize("unit", sorted(EXPOSURE))
def test_every_credential_used_is_loaded(unit: str) -> None:
    """Each file a unit (with its drop-ins) reads from its credentials directory is one it
    loads (systemd copies only those), and each one it loads is read."""
    found = directives(UNITS / unit)
    loaded = {entry.partition(":")[0] for entry in found["LoadCredential"]}
    used = {
        name
        for key in ("ExecStart", "ExecStop", "Environment")
        for value in found.get(key, [])
        for name in CREDENTIAL_PATH.findall(value)
    }
    assert used == loaded, f"read, not loaded: {used - loaded}; loaded, unread: {loaded - used}"
    for entry in found["LoadCredential"]:
        assert entry.partition(":")[2].startswith("/etc/strata/"), entry


def test_hub_runs_as_a_replica_with_secrets_as_credentials() -> None:
    """A replica needs the grant key every replica shares (without it `serve --catalog`
    refuses to start), its catalog password where its dynamic user can read it, and its
    bucket key in a file: all three from the credentials directory, none in the
    environment (test_systemd_replica.py runs it)."""
    hub = directives(UNITS / "strata-hub.service")
    (start,) = hub["ExecStart"]
    assert "--grant-key=${CREDENTIALS_DIRECTORY}/grant.key" in start
    assert hub["DynamicUser"] == ["yes"]
    env = dict(pair.split("=", 1) for value in hub["Environment"] for pair in value.split())
    assert env["PGPASSFILE"] == "%d/pgpass" and env["PGSSLROOTCERT"] == "%d/catalog-ca.crt"
    assert env["AWS_SHARED_CREDENTIALS_FILE"] == "%d/s3-credentials"
    unset = {name for value in hub["UnsetEnvironment"] for name in value.split()}
    assert set(ENVIRONMENT_SECRETS) <= unset, "UnsetEnvironment= drops them whoever set them"
