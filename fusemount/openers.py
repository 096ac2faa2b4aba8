"""Who an open is counted for: :class:`Opener`, a pod (or another cgroup owner), not a uid.

The mount is one for every pod of a node (the CSI plugin binds a version's directory
into each), and pods share uids routinely — root where a pod does not set
``runAsUser``, 1000 or 65532 in many images — so a quota per uid let one pod's opens
fail every other pod's of that uid (issue 39's nineteenth probe: a root pod's 262,144
opens made another root pod's, and root's on the node, fail ``EMFILE``). Nor is it a uid
within a cgroup: a root pod sets any fsuid it likes, and 2,000 uids of one pod, an open
each, cut every other pod's fair share of the node's handles to 522 (the twentieth
probe). A process cannot leave its cgroup without privileges, so the opener is the
cgroup's owner (:func:`owner_of`): a Kubernetes pod (its containers together), a systemd
user slice (a user's sessions and user services together, however many scopes they
make), else the cgroup itself (a service). The cgroup is read from ``/proc/PID/cgroup``
(the spoke's DaemonSet runs in the host's PID namespace); where it cannot be (the
process is gone, or the mount sees no PID), the opener is the uid.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import NamedTuple

CACHE_S = 1.0
"""How long a process's cgroup is remembered, seconds (PIDs are reused only after the
kernel's PID space wraps)."""

CACHE_MOST = 65_536
"""Most processes remembered at once (the memory is dropped when it is full)."""


class Opener(NamedTuple):
    """Whom an open is counted for: the owner of a ``cgroup`` (:func:`owner_of`), or, when
    the cgroup is unknown (``""``), a ``uid`` (None otherwise)."""

    cgroup: str
    uid: int | None


_POD = re.compile(r"(^|[-_])pod[0-9a-f]{8}[-_]?[0-9a-f]{4}")  # a pod's UID, either driver


def owner_of(cgroup: str) -> str:
    """The part of a :func:`cgroup_path` that names its owner: each path cut after its
    first component that is a Kubernetes pod's (``pod<UID>``, or systemd's
    ``kubepods-<class>-pod<UID>.slice``) or a systemd user slice (``user-<UID>.slice``)."""
    lines = []
    for line in cgroup.split("\n"):
        head, slash, path = line.partition("/")
        kept = []
        for part in path.split("/"):
            kept.append(part)
            if _POD.search(part) or (part.startswith("user-") and part.endswith(".slice")):
                break
        lines.append(head + slash + "/".join(kept))
    return "\n".join(lines)


def cgroup_of(pid: int) -> str:
    """The cgroups of ``pid`` (:func:`cgroup_path`), as this process's cgroup namespace
    sees them; ``""`` when they cannot be read."""
    if pid <= 0:
        return ""
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as file:
            text = file.read(4096).decode("utf-8", "replace")
    except OSError:
        return ""
    return cgroup_path(text)


def cgroup_path(text: str) -> str:
    """The cgroup a ``/proc/PID/cgroup`` file's ``text`` names (cgroups(7)): the unified
    hierarchy's path on a cgroup v2 host (one line, ``0::PATH``); on a v1 or hybrid one,
    every hierarchy's ``CONTROLLERS:PATH``, one a line, sorted (a container's unified
    line is often just ``/`` there, its memory and pids hierarchies are its own)."""
    hierarchies = sorted(
        rest for line in text.splitlines() for rest in [line.partition(":")[2]] if rest
    )
    if len(hierarchies) == 1 and hierarchies[0].startswith(":"):
        return hierarchies[0][1:]
    return "\n".join(hierarchies)


class Openers:
    """:class:`Opener` of a FUSE request's ``(pid, uid)``, each process's cgroup read at
    most once a :data:`CACHE_S`.

    Args:
        clock: monotonic seconds (tests pass a fake).

    Not thread-safe: the mount's trio loop owns it.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[int, tuple[str, float]] = {}  # pid -> cgroup, until

    def of(self, pid: int, uid: int) -> Opener:
        """Whom an open by ``pid`` (a thread's id, as FUSE gives it) of ``uid`` counts for:
        its cgroup's owner, else the uid."""
        now = self._clock()
        seen = self._seen.get(pid)
        if seen is None or seen[1] < now:
            if len(self._seen) >= CACHE_MOST:
                self._seen.clear()
            seen = (owner_of(cgroup_of(pid)), now + CACHE_S)
            self._seen[pid] = seen
        return Opener(seen[0], None) if seen[0] else Opener("", uid)
