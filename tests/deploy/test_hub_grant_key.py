"""The hub's grant key in Kubernetes: the file ``--grant-key`` names is one the hub accepts.

The hub refuses a grant key that group or others may read (``hub/auth/grants.py``), and a
Secret volume in a pod with ``fsGroup`` holds ``root:FSGROUP`` files with the group's read
bit set, so the shipped StatefulSet, which pointed ``--grant-key`` at the Secret, made
replicas that never started. An initContainer now copies the key, as the hub's uid, into
a memory-backed emptyDir as an owner-only file. These tests render the hub region, check
that the path the hub reads is the one the initContainer writes, then run the
initContainer's own command over a Secret volume and an emptyDir laid out as the kubelet
lays them out, as the pod's uid and groups, and load the result with the hub's own loader
as that uid.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub.auth.grants import load_grant_key
from hub.errors import ConfigError
from tests.conftest import REPO_ROOT
from tests.deploy.k8s_support import Obj, by_key, copy_tree, rendered

GRANT_SECRET = "strata-hub-grant"


@pytest.fixture(scope="module")
def hub_objects(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], Obj]:
    return by_key(rendered(copy_tree(tmp_path_factory.mktemp("deploy")), "hub-region"))


def _flag(args: list[str], name: str) -> str:
    (value,) = [a.partition("=")[2] for a in args if a.startswith(f"{name}=")]
    return value


def _mount_for(container: Obj, path: str) -> Obj:
    """The container's volumeMount holding ``path`` (the deepest)."""
    mounts = [m for m in container["volumeMounts"] if (path + "/").startswith(m["mountPath"] + "/")]
    assert mounts, f"{container['name']}: {path} is on no volume"
    return max(mounts, key=lambda m: len(m["mountPath"]))


def _volume(pod: Obj, name: str) -> Obj:
    (volume,) = [v for v in pod["volumes"] if v["name"] == name]
    assert isinstance(volume, dict)
    return volume


def _hub_pod(hub_objects: dict[tuple[str, str, str], Obj]) -> tuple[Obj, Obj, Obj]:
    """The hub's pod spec, its hub container and its grant-key initContainer."""
    pod = hub_objects[("StatefulSet", "strata", "strata-hub")]["spec"]["template"]["spec"]
    (hub,) = [c for c in pod["containers"] if c["name"] == "hub"]
    (init,) = [c for c in pod.get("initContainers", []) if c["name"] == "grant-key"]
    return pod, hub, init


def test_the_hub_reads_what_the_init_container_writes(
    hub_objects: dict[tuple[str, str, str], Obj],
) -> None:
    """``--grant-key`` is the file the initContainer writes, on a memory-backed emptyDir
    both mount (the hub read-only); the initContainer reads the key from the Secret's
    volume, runs as the hub's uid (the pod's, overridden by neither) and may not escalate."""
    pod, hub, init = _hub_pod(hub_objects)
    key = _flag(hub["args"], "--grant-key")
    source, written = init["command"][-2:]
    assert written == key, "the hub reads another file than the initContainer writes"
    hub_mount, init_mount = _mount_for(hub, key), _mount_for(init, key)
    assert hub_mount["name"] == init_mount["name"]
    assert hub_mount["mountPath"] == init_mount["mountPath"]
    assert hub_mount.get("readOnly") is True and not init_mount.get("readOnly")
    copy = _volume(pod, hub_mount["name"])
    assert copy["emptyDir"]["medium"] == "Memory", "the key never reaches the node's disk"
    from_mount = _mount_for(init, source)
    secret = _volume(pod, from_mount["name"])["secret"]
    assert secret["secretName"] == GRANT_SECRET
    name = source.removeprefix(from_mount["mountPath"] + "/")
    assert name in hub_objects[("Secret", "strata", GRANT_SECRET)]["data"]
    assert from_mount["name"] not in {m["name"] for m in hub["volumeMounts"]}, (
        "the hub sees only the owner-only copy"
    )
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["runAsNonRoot"] is True
    for container in (hub, init):
        context = container.get("securityContext", {})
        assert "runAsUser" not in context and "runAsGroup" not in context, container["name"]
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    assert init["securityContext"]["capabilities"]["drop"] == ["ALL"]


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory the pod's uid can reach (pytest's own tmp is root's alone)."""
    root = Path(tempfile.mkdtemp(prefix="strata-grant-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root)


def _secret_volume(directory: Path, data: dict[str, bytes], mode: int, gid: int) -> None:
    """A Secret volume as the kubelet's atomic writer makes it: the files in a timestamped
    directory, ``..data`` a link to it, each key a link through ``..data``; with
    ``fsGroup`` every file is ``root:FSGROUP`` with the group's read bit added."""
    directory.mkdir(mode=0o1777)
    stamped = directory / "..2026_12_06_00_00_00.000000001"
    stamped.mkdir(mode=0o755)
    for key, value in data.items():
        (stamped / key).write_bytes(value)
        os.chown(stamped / key, 0, gid)
        (stamped / key).chmod(mode | 0o440)
        (directory / key).symlink_to(f"..data/{key}")
    (directory / "..data").symlink_to(stamped.name)
    os.chown(directory, 0, gid)
    directory.chmod(0o1777)


def _as(uid: int, gid: int, groups: list[int]) -> list[str]:
    """The prefix that runs a command as the pod's uid, gid and supplementary groups."""
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={gid}",
        f"--groups={','.join(map(str, groups))}",
        "--",
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="making root:FSGROUP files needs root")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv is not installed")
def test_the_copy_passes_the_hubs_own_key_check(
    hub_objects: dict[tuple[str, str, str], Obj], reachable: Path
) -> None:
    """The initContainer's command, run as the pod's uid over volumes laid out as the
    kubelet lays them out, makes a file the hub's loader accepts as that uid (the same key
    as the Secret's); the Secret's own file, which the hub used to read, is refused."""
    pod, hub, init = _hub_pod(hub_objects)
    context = pod["securityContext"]
    uid, gid, fs_group = context["runAsUser"], context["runAsGroup"], context["fsGroup"]
    secret_data = {
        k: base64.b64decode(v)
        for k, v in hub_objects[("Secret", "strata", GRANT_SECRET)]["data"].items()
    }
    where: dict[str, Path] = {}
    for mount in init["volumeMounts"]:
        volume = _volume(pod, mount["name"])
        local = reachable / mount["name"]
        where[mount["mountPath"]] = local
        if "secret" in volume:
            _secret_volume(local, secret_data, volume["secret"]["defaultMode"], fs_group)
        else:
            assert "emptyDir" in volume, mount["name"]
            local.mkdir()  # the kubelet's emptyDir: 0777, setgid to the fsGroup
            os.chown(local, 0, fs_group)
            local.chmod(0o2777)

    def local_path(path: str) -> str:
        mount = _mount_for(init, path)["mountPath"]
        return str(where[mount]) + path.removeprefix(mount)

    command = [local_path(a) if a.startswith("/") else a for a in init["command"]]
    subprocess.run([*_as(uid, gid, [fs_group]), *command], check=True, timeout=30)

    key_path = _flag(hub["args"], "--grant-key")
    copy = Path(local_path(key_path))
    st = copy.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (uid, 0o600)
    check = (
        "import sys; from pathlib import Path; from hub.auth.grants import load_grant_key; "
        "from cryptography.hazmat.primitives import serialization as s; "
        "key = load_grant_key(Path(sys.argv[1])); "
        "print(key.public_key().public_bytes(s.Encoding.Raw, s.PublicFormat.Raw).hex())"
    )
    loaded = subprocess.run(
        [*_as(uid, gid, [fs_group]), sys.executable, "-c", check, str(copy)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert loaded.returncode == 0, loaded.stderr
    from cryptography.hazmat.primitives import serialization

    from_secret = serialization.load_pem_private_key(secret_data["grant.key"], password=None)
    raw = (serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert loaded.stdout.strip() == from_secret.public_key().public_bytes(*raw).hex()

    (source,) = [a for a in init["command"] if a.startswith("/") and a != key_path]
    with pytest.raises(ConfigError, match="readable by group or others"):
        load_grant_key(Path(local_path(source)))
