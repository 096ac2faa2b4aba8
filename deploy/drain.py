"""Wait until no other process has a file open on a mount: the spoke pod's preStop hook.

    python -m deploy.drain --mount /mnt/strata/data [--timeout 3500] [--interval 5]

A spoke that stops unmounts its FUSE mount; every file a training job still has open on
it then fails with ``ENOTCONN`` (DESIGN.md, "Process model"). Kubernetes runs a pod's
preStop hook before it sends SIGTERM, so the spoke DaemonSet runs this first: it polls
``/proc/*/fd`` and ``/proc/*/cwd`` of every process it can see (the pod runs with
``hostPID: true``, so that is every process on the node) and returns once none of them
holds a file or a working directory on the mount (the spoke's own processes never do:
nothing in them touches the mountpoint). A file is
on the mount when ``stat`` of the descriptor gives the mount's device number, which does
not depend on where the mount appears in the other process's mount namespace.

The descriptors of another user's process (or one with capabilities this one lacks) are
readable only with ``CAP_SYS_PTRACE`` (ptrace(2), "Ptrace access mode checking"): the
systemd unit keeps it in its bounding set, the privileged pod has it. Processes it was
refused are named in a warning on stderr, since it cannot tell whether they hold the mount.

A volume the CSI plugin (``strata-csi``, csi/) published is a bind mount of one version's
directory under the kubelet's pod directory: its pod may have no file open at the moment
and still read the next one, and the bind dies with this mount, so the drain also waits
while any bind of a directory of the mount's file system is in the node's mount table
(``/proc/1/mountinfo``, pid 1 of the node with ``hostPID``; this process's own table where
that cannot be read). The kubelet unpublishes a pod's volume once the pod is gone.

When the spoke was succeeded (``strata-spoke run --take-over`` in a new pod beside this
one took over the FUSE connection: spoke/run/succession.py), the mount is no longer this
pod's to protect: the drain returns at once. It knows by the processes serving the
mount (``fusemount ... MOUNTPOINT``): there are some, and none is in this process's
cgroup, which an ``exec`` hook shares with the container it runs in; a spoke still
serving from this container (a real stop: a node drain, a deleted pod, a rollout without
succession) is waited for as above.

With ``--cordon`` (the DaemonSet's hook), a drain that has to wait first cordons the
node (``PATCH /api/v1/nodes/NODE`` ``spec.unschedulable``, as ``kubectl cordon``) with the
pod's service account (``nodes`` ``get``/``patch``: deploy/k8s/base/spoke/rbac.yaml), so
that no new job lands on a node whose spoke is going away and the wait ends when the
running ones do; the annotation ``strata.io/cordoned-by`` says why, and ``kubectl
uncordon NODE`` undoes it once the new spoke is ready. A cordon that fails is a warning:
the drain waits all the same.

Exit status: 0 when the mount is idle, not mounted, or handed over; 1 when
``--timeout`` seconds pass first (the busy processes are listed on stderr; Kubernetes
then stops the spoke anyway, at the end of ``terminationGracePeriodSeconds``); 2 for
bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from spoke.run.startup import mount_processes
from strata_local.mountinfo import mounts

PROG = "deploy.drain"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
CORDONED_BY = "strata.io/cordoned-by"
NODE_MOUNTINFO = "/proc/1/mountinfo"


@dataclass(frozen=True)
class Holder:
    """A process with something open on the mount, or (``pid`` 0) a bind mount of one of
    its directories: a published volume."""

    pid: int
    command: str
    path: str

    def __str__(self) -> str:
        if self.pid == 0:
            return f"{self.path} is a bind of {self.command} (a published volume)"
        return f"pid {self.pid} ({self.command}) still has {self.path} open"


def _entries(pid: int) -> Iterator[Path]:
    yield Path(f"/proc/{pid}/cwd")
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return
    for name in names:
        yield Path(f"/proc/{pid}/fd/{name}")


def holders(mount: Path, exclude: set[int], refused: set[int] | None = None) -> list[Holder]:
    """Processes other than ``exclude`` with a descriptor or cwd on ``mount``'s device.
    The pids whose descriptors this process may not read are added to ``refused``.

    Raises:
        OSError: ``mount`` cannot be stat'ed.
    """
    device = os.stat(mount).st_dev
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        pid = int(entry)
        for link in _entries(pid):
            try:
                if os.stat(link).st_dev != device:
                    continue
                target = os.readlink(link)
                command = Path(f"/proc/{pid}/comm").read_text().strip()
            except PermissionError:  # another user's, without CAP_SYS_PTRACE
                if refused is not None:
                    refused.add(pid)
                continue
            except OSError:  # gone, or a descriptor we may not follow
                continue
            found.append(Holder(pid, command, target))
            break
    return found


def published(
    mount: Path, tables: tuple[str, ...] = (NODE_MOUNTINFO, "/proc/self/mountinfo")
) -> list[Holder]:
    """Bind mounts of a directory of ``mount``'s file system (other than its root), from
    the first of ``tables`` that can be read: volumes published from the mount. Each is a
    :class:`Holder` with pid 0, ``command`` the bound directory, ``path`` the mountpoint.

    Raises:
        OSError: ``mount`` cannot be stat'ed, or no table can be read.
    """
    st_dev = os.stat(mount).st_dev
    device = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    for table in tables:
        try:
            table_mounts = mounts(table)
        except OSError:
            if table == tables[-1]:
                raise
            continue
        return [Holder(0, m.root, m.mountpoint) for m in table_mounts
                if m.device == device and m.root != "/"]  # fmt: skip
    return []


def _cgroup(pid: int | str) -> str | None:
    try:
        return Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None


def handed_over(mount: Path, own: str | None = None) -> bool:
    """True when ``mount``'s connection was handed to a successor: strata mount processes
    serve it and none shares this process's cgroup (``own``, default ``/proc/self/cgroup``:
    the container of the hook). False when none serves it, one of this container's does,
    or cgroups cannot be read."""
    own = own if own is not None else _cgroup("self")
    serving = [_cgroup(pid) for pid in mount_processes(mount.resolve())]
    return own is not None and bool(serving) and None not in serving and own not in serving


def _mounted(mount: Path) -> bool:
    try:
        return os.path.ismount(mount)
    except OSError:  # a dead FUSE mount: ENOTCONN — nothing left to protect
        return False


@dataclass(frozen=True)
class Cordon:
    """Cordons ``node`` through the Kubernetes API at ``api`` (a base URL), with the bearer
    token in ``token_file`` and, for ``https``, the CA bundle ``ca_file``."""

    node: str
    api: str
    token_file: Path
    ca_file: Path

    def __call__(self, why: str) -> None:
        """Mark the node unschedulable, annotated with ``why``.

        Raises:
            OSError: the token or CA file cannot be read.
            httpx.HTTPError: the API cannot be reached or refused (e.g. 403 without RBAC).
        """
        token = self.token_file.read_text().strip()
        body = {"spec": {"unschedulable": True}, "metadata": {"annotations": {CORDONED_BY: why}}}
        reply = httpx.patch(
            f"{self.api.rstrip('/')}/api/v1/nodes/{self.node}",
            content=json.dumps(body),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/merge-patch+json",
            },
            verify=str(self.ca_file) if self.api.startswith("https:") else True,
            timeout=10.0,
        )
        reply.raise_for_status()


def drain(
    mount: Path,
    timeout: float,
    interval: float,
    refused: set[int] | None = None,
    on_busy: Callable[[list[Holder]], None] | None = None,
) -> list[Holder]:
    """Polls :func:`holders` until none are left, the mount was handed over
    (:func:`handed_over`) or ``timeout`` seconds pass; ``refused`` gets the pids of the
    last poll whose descriptors could not be read; ``on_busy`` is called once, with the
    holders, when the first poll finds the mount busy.

    Returns:
        The holders at the end: empty when the mount became idle (or is not mounted, or
        was handed over).
    """
    deadline = time.monotonic() + timeout
    exclude = {os.getpid()}
    while True:
        if not _mounted(mount) or handed_over(mount):
            return []
        if refused is not None:
            refused.clear()
        try:
            busy = holders(mount, exclude, refused) + published(mount)
        except OSError:
            return []
        if not busy or time.monotonic() >= deadline:
            return busy
        if on_busy is not None:
            on_busy(busy)
            on_busy = None
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__)
    parser.add_argument("--mount", type=Path, required=True, help="the spoke's mountpoint")
    parser.add_argument("--timeout", type=float, default=3500.0, help="seconds (3500)")
    parser.add_argument("--interval", type=float, default=5.0, help="poll period, s (5)")
    parser.add_argument(
        "--cordon", action="store_true", help="cordon the node first when it has to wait"
    )
    parser.add_argument("--node", default=os.environ.get("NODE_NAME"), help="($NODE_NAME)")
    parser.add_argument("--api", default=_in_cluster_api(), help="the API's base URL (in-cluster)")
    parser.add_argument("--token-file", type=Path, default=SERVICE_ACCOUNT / "token")
    parser.add_argument("--ca-file", type=Path, default=SERVICE_ACCOUNT / "ca.crt")
    args = parser.parse_args(argv)
    if args.timeout < 0 or args.interval <= 0:
        print(f"{PROG}: error: --timeout must be >= 0 and --interval > 0", file=sys.stderr)
        return 2
    if args.cordon and not (args.node and args.api):
        print(f"{PROG}: error: --cordon needs --node (or NODE_NAME) and --api (or "
              "KUBERNETES_SERVICE_HOST, in a pod)", file=sys.stderr)  # fmt: skip
        return 2
    on_busy = None
    if args.cordon:
        cordon = Cordon(args.node, args.api, args.token_file, args.ca_file)
        on_busy = lambda busy: _cordon(cordon, args.mount, busy)  # noqa: E731
    refused: set[int] = set()
    busy = drain(args.mount, args.timeout, args.interval, refused, on_busy)
    if refused:
        pids = ", ".join(map(str, sorted(refused)[:10])) + (", …" if len(refused) > 10 else "")
        print(
            f"{PROG}: warning: may not read the open files of {len(refused)} process(es) "
            f"(pid {pids}): reading another user's (or a more privileged process's) needs "
            "CAP_SYS_PTRACE, so they may hold the mount unseen",
            file=sys.stderr,
        )
    if busy:
        for holder in busy:
            print(f"{PROG}: {holder}", file=sys.stderr)
        print(f"{PROG}: {args.mount} still busy after {args.timeout:.0f} s", file=sys.stderr)
        return 1
    if _mounted(args.mount) and handed_over(args.mount):
        print(f"{PROG}: {args.mount} was handed over to a new spoke: nothing to wait for",
              file=sys.stderr)  # fmt: skip
        return 0
    print(f"{PROG}: {args.mount} is idle", file=sys.stderr)
    return 0


def _in_cluster_api() -> str | None:
    host, port = (
        os.environ.get("KUBERNETES_SERVICE_HOST"),
        os.environ.get("KUBERNETES_SERVICE_PORT"),
    )
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def _cordon(cordon: Cordon, mount: Path, busy: list[Holder]) -> None:
    why = f"{PROG}: the spoke is stopping; {len(busy)} holder(s) of {mount} to wait for"
    try:
        cordon(why)
    except (OSError, httpx.HTTPError) as err:
        print(f"{PROG}: warning: could not cordon node {cordon.node} ({err}): waiting all "
              "the same", file=sys.stderr)  # fmt: skip
        return
    print(f"{PROG}: cordoned node {cordon.node} while its jobs finish; kubectl uncordon "
          f"{cordon.node} once the new spoke is ready", file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
