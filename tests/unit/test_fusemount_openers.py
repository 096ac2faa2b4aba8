"""Whom an open counts for (fusemount.openers): a uid in the cgroup /proc says its process
is in — pods share uids, not cgroups (issue 39's nineteenth probe)."""

from __future__ import annotations

import os
from pathlib import Path

from fusemount.openers import Opener, Openers, cgroup_of, cgroup_path, owner_of


def test_a_v2_host_names_the_unified_path_and_a_v1_host_every_hierarchy() -> None:
    v2 = "0::/kubepods.slice/kubepods-besteffort-pod12.slice/cri-containerd-ab.scope\n"
    assert (
        cgroup_path(v2) == "/kubepods.slice/kubepods-besteffort-pod12.slice/cri-containerd-ab.scope"
    )
    # hybrid: the container's unified line is just "/", its v1 hierarchies tell it apart
    pod_a = "4:memory:/kubepods/pod-a/c1\n2:pids:/kubepods/pod-a/c1\n0::/\n"
    pod_b = "4:memory:/kubepods/pod-b/c1\n2:pids:/kubepods/pod-b/c1\n0::/\n"
    assert cgroup_path(pod_a) != cgroup_path(pod_b)
    assert cgroup_path(pod_a) == ":/\nmemory:/kubepods/pod-a/c1\npids:/kubepods/pod-a/c1"
    assert cgroup_path("") == ""


def test_a_live_process_has_one_and_a_gone_one_none() -> None:
    assert cgroup_of(os.getpid()) == cgroup_path(Path("/proc/self/cgroup").read_text()) != ""
    assert cgroup_of(0) == "" and cgroup_of(-1) == ""
    assert cgroup_of(2**22 + 12345) == ""  # past pid_max: no such process


def test_a_process_is_read_again_after_a_second() -> None:
    now = [0.0]
    openers = Openers(clock=lambda: now[0])
    mine = openers.of(os.getpid(), 1000)
    assert mine == Opener(owner_of(cgroup_of(os.getpid())), None)
    assert openers.of(os.getpid(), 1001) == mine  # its cgroup's, whatever the uid
    gone = 2**22 + 12345
    assert openers.of(gone, 1000) == Opener("", 1000)  # no cgroup known: the uid
    now[0] += 2.0
    assert openers.of(os.getpid(), 1000) == mine


def test_a_pods_or_a_users_cgroups_have_one_owner() -> None:
    """A pod's containers, or a user's sessions and the scopes its user manager makes,
    count as one opener: a scope each would dilute every other's fair share."""
    systemd_pod = (
        "/kubepods.slice/kubepods-besteffort.slice/"
        "kubepods-besteffort-pod1234abcd_5678_90ab_cdef_1234567890ab.slice"
    )
    assert owner_of(f"{systemd_pod}/cri-containerd-ab.scope") == systemd_pod
    assert owner_of(f"{systemd_pod}/cri-containerd-cd.scope") == systemd_pod
    cgroupfs_pod = "/kubepods/besteffort/pod1234abcd-5678-90ab-cdef-1234567890ab"
    assert owner_of(f"{cgroupfs_pod}/0123abcd") == cgroupfs_pod
    user = "/user.slice/user-1000.slice"
    assert owner_of(f"{user}/session-3.scope") == user
    assert owner_of(f"{user}/user@1000.service/app.slice/run-r1.scope") == user
    assert owner_of("/system.slice/strata-spoke.service") == "/system.slice/strata-spoke.service"
    v1 = f"memory:{cgroupfs_pod}/c1\npids:{cgroupfs_pod}/c1"
    assert owner_of(v1) == f"memory:{cgroupfs_pod}\npids:{cgroupfs_pod}"
