"""deploy.drain (the spoke pod's preStop): waits while another process has a file open
on the mount, returns once none has, and gives up after its timeout — also run with
exactly the capabilities the systemd unit gives it, against another user's process."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from deploy import drain
from tests.conftest import REPO_ROOT
from tests.deploy.conftest import Live
from tests.support import other_user

pytestmark = pytest.mark.fuse

SPOKE_UNIT = REPO_ROOT / "deploy" / "systemd" / "strata-spoke.service"


def _drain(
    mount: Path, timeout: float, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *prefix,
            sys.executable,
            "-m",
            "deploy.drain",
            f"--mount={mount}",
            f"--timeout={timeout}",
            "--interval=0.1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _holder(code: str) -> subprocess.Popen[str]:
    """A process that runs ``code`` (which opens something on the mount), says "ready"
    and then waits for its stdin to close."""
    proc = subprocess.Popen(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('ready', flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def _release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(10)


def test_idle_mount_drains_at_once(live: Live) -> None:
    result = _drain(live.mount, timeout=0)
    assert result.returncode == 0, result.stderr
    assert "is idle" in result.stderr


@pytest.mark.parametrize(
    "code",
    ["f = open({path!r}, 'rb'); f.read(10)", "import os; os.chdir({dir!r})"],
    ids=["open-file", "cwd"],
)
def test_busy_mount_waits_then_times_out(live: Live, code: str) -> None:
    path = live.mount / "demo" / "v1" / "a.bin"
    holder = _holder(code.format(path=str(path), dir=str(path.parent)))
    try:
        result = _drain(live.mount, timeout=0.5)
        assert result.returncode == 1, result.stderr
        assert f"pid {holder.pid} (python" in result.stderr
        assert "still busy after" in result.stderr
    finally:
        _release(holder)
    result = _drain(live.mount, timeout=0)
    assert result.returncode == 0, result.stderr


def test_drain_returns_when_the_holder_closes(live: Live) -> None:
    holder = _holder(f"f = open({str(live.mount / 'demo' / 'v1' / 'b.txt')!r}, 'rb')")
    drain = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "deploy.drain",
            f"--mount={live.mount}",
            "--timeout=60",
            "--interval=0.1",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            drain.wait(1.0)  # still waiting: the file is open
    finally:
        _release(holder)
    assert drain.wait(30) == 0
    assert drain.stderr is not None and "is idle" in drain.stderr.read()


def test_a_published_volume_keeps_the_mount_busy(live: Live, tmp_path: Path) -> None:
    """A bind of one version's directory (what strata-csi publishes for a pod) keeps the
    drain waiting with no file open, since the bind dies with the mount; unmounted, the
    mount is idle again."""
    if os.geteuid() != 0:
        pytest.skip("a bind mount needs root")
    volume = tmp_path / "pod" / "volume"
    volume.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(live.mount / "demo" / "v1"), str(volume)], check=True)
    try:
        result = _drain(live.mount, timeout=0.3)
        assert result.returncode == 1, result.stderr
        assert f"{volume} is a bind of /demo/v1 (a published volume)" in result.stderr
    finally:
        subprocess.run(["umount", str(volume)], check=True)
    result = _drain(live.mount, timeout=0)
    assert result.returncode == 0, result.stderr


def test_handed_over_is_told_by_the_cgroups_of_the_mounts_processes(
    live: Live, tmp_path: Path
) -> None:
    """The live spoke's mount processes share this process's cgroup: its own mount, not
    handed over; seen from another container's cgroup they are a successor's."""
    assert not drain.handed_over(live.mount)
    assert drain.handed_over(live.mount, own="0::/kubepods/pod-old/spoke\n")
    assert not drain.handed_over(tmp_path, own="0::/elsewhere\n")  # nothing serves it


def test_a_drain_in_the_succeeded_pods_container_returns_at_once(live: Live) -> None:
    """The preStop hook of a spoke pod that was succeeded runs in that pod's container, a
    cgroup that serves the mount no more: with a file still open it returns at once."""
    group = Path("/sys/fs/cgroup/unified") / f"strata-drain-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as err:
        pytest.skip(f"cannot make a cgroup v2 group here: {err}")
    holder = _holder(f"f = open({str(live.mount / 'demo' / 'v1' / 'b.txt')!r}, 'rb')")
    procs = str(group / "cgroup.procs")
    try:
        result = subprocess.run(
            ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", sys.executable, "-m",
             "deploy.drain", f"--mount={live.mount}", "--timeout=30", "--interval=0.1"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        _release(holder)
        group.rmdir()
    assert result.returncode == 0, result.stderr
    assert "was handed over to a new spoke" in result.stderr


class _FakeAPI:
    """A stand-in for the Kubernetes API on 127.0.0.1: records each request (method, path,
    headers, JSON body) and answers ``status``."""

    def __init__(self, status: int = 200) -> None:
        self.requests: list[tuple[str, str, dict[str, str], object]] = []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_PATCH(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                api.requests.append(("PATCH", self.path, dict(self.headers), json.loads(body)))
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _cordoning_drain(
    mount: Path, api: _FakeAPI, token: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deploy.drain", f"--mount={mount}", f"--timeout={timeout}",
         "--interval=0.1", "--cordon", "--node=gpu-7", f"--api={api.url}",
         f"--token-file={token}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("status", [200, 403])
def test_a_drain_that_has_to_wait_cordons_the_node_first(
    live: Live, tmp_path: Path, status: int
) -> None:
    """One PATCH of the node, as ``kubectl cordon`` sends it, with the service account's
    token; a refusal (no RBAC) is a warning and the drain waits all the same; an idle
    mount cordons nothing."""
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    api = _FakeAPI(status)
    holder = _holder(f"f = open({str(live.mount / 'demo' / 'v1' / 'b.txt')!r}, 'rb')")
    try:
        result = _cordoning_drain(live.mount, api, token, timeout=0.5)
    finally:
        _release(holder)
    try:
        assert result.returncode == 1 and "still busy after" in result.stderr, result.stderr
        ((method, path, headers, body),) = api.requests
        assert (method, path) == ("PATCH", "/api/v1/nodes/gpu-7")
        assert headers["Authorization"] == "Bearer sa-token"
        assert headers["Content-Type"] == "application/merge-patch+json"
        assert isinstance(body, dict) and body["spec"] == {"unschedulable": True}
        assert "strata.io/cordoned-by" in body["metadata"]["annotations"]
        if status == 200:
            assert "cordoned node gpu-7" in result.stderr
        else:
            assert "could not cordon node gpu-7" in result.stderr and "403" in result.stderr
        idle = _cordoning_drain(live.mount, api, token, timeout=5)
        assert idle.returncode == 0 and len(api.requests) == 1, idle.stderr
    finally:
        api.close()


def test_cordon_needs_a_node_and_an_api(live: Live) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "KUBERNETES_SERVICE_HOST")}
    bad = subprocess.run(
        [sys.executable, "-m", "deploy.drain", f"--mount={live.mount}", "--cordon"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "--cordon needs --node" in bad.stderr


def test_not_a_mount_and_bad_arguments(tmp_path: Path) -> None:
    assert _drain(tmp_path, timeout=0).returncode == 0  # nothing mounted: nothing to protect
    bad = subprocess.run(
        [sys.executable, "-m", "deploy.drain", f"--mount={tmp_path}", "--interval=0"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "error:" in bad.stderr


def unit_capabilities(unit: Path) -> list[str]:
    """The unit's ``CapabilityBoundingSet=`` as capability names (``cap_sys_admin``, …):
    the union of every such line (systemd.exec(5)); an empty assignment resets it."""
    caps: list[str] = []
    for line in unit.read_text().splitlines():
        key, sep, value = line.partition("=")
        if not sep or key.strip() != "CapabilityBoundingSet":
            continue
        assert not value.strip().startswith("~"), "an inverted set: not supported here"
        caps = [*caps, *value.split()] if value.strip() else []
    return [c.lower() for c in caps]


def _under_unit_caps(caps: list[str]) -> tuple[str, ...]:
    """A command prefix that runs the rest as root with only ``caps`` (bounding set, and so
    permitted and effective after exec) and no_new_privs, as systemd runs the unit's
    ``ExecStop=`` (the unit has no ``User=``: root)."""
    bounding = ",".join(["-all", *(f"+{c.removeprefix('cap_')}" for c in caps)])
    return ("setpriv", f"--bounding-set={bounding}", "--no-new-privs", "--")


def test_unit_capabilities_parse() -> None:
    caps = unit_capabilities(SPOKE_UNIT)
    assert "cap_sys_admin" in caps, caps  # FUSE's mount(2)
    assert all(c.startswith("cap_") for c in caps), caps


def test_drain_under_the_units_capabilities_sees_another_users_files(live: Live) -> None:
    """``systemctl stop strata-spoke`` runs the drain with the unit's capability bounding
    set; a trainer running as another user, with a file open on the mount, must keep it
    busy. Reading another user's ``/proc/PID/fd`` needs ``CAP_SYS_PTRACE``: without it the
    drain cannot see the descriptor and calls the mount idle (issue 27, blocker 1)."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    user = other_user()
    caps = unit_capabilities(SPOKE_UNIT)
    fd = os.open(live.mount / "demo" / "v1" / "a.bin", os.O_RDONLY)
    try:
        # the trainer: another user's shell holding the descriptor (handed over at exec,
        # as a job's file would be), which says "ready" only once it runs as that user
        holder = subprocess.Popen(
            [
                "setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
                "--", "sh", "-c", "echo ready; read line",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            pass_fds=(fd,),
        )  # fmt: skip
    finally:
        os.close(fd)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        assert os.stat(f"/proc/{holder.pid}").st_uid == user.pw_uid
        result = _drain(live.mount, timeout=0.3, prefix=_under_unit_caps(caps))
        assert result.returncode == 1, f"unit caps {caps}: {result.stderr}"
        assert f"pid {holder.pid} (sh)" in result.stderr
        # the check above can fail: the same drain without CAP_SYS_PTRACE is blind to it
        blind = [c for c in caps if c != "cap_sys_ptrace"]
        result = _drain(live.mount, timeout=0, prefix=_under_unit_caps(blind))
        assert result.returncode == 0 and "is idle" in result.stderr, result.stderr
        # … and says so
        assert "warning: may not read the open files of" in result.stderr
        assert "CAP_SYS_PTRACE" in result.stderr
    finally:
        _release(holder)
