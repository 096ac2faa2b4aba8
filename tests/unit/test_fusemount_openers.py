"""Whom an open counts for (fusemount.openers): a uid in the cgroup /proc says its process
is in — pods share uids, not cgroups (issue 39's nineteenth probe)."""

from __future__ import annotations

import os
from pathlib import Path

from fusemount.openers import Opener, Openers, cgroup_of, cgroup_path


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
    assert mine == Opener(1000, cgroup_of(os.getpid()))
    assert openers.of(os.getpid(), 1001) == Opener(1001, mine.cgroup)  # the uid is the call's
    gone = 2**22 + 12345
    assert openers.of(gone, 1000) == Opener(1000, "")
    now[0] += 2.0
    assert openers.of(os.getpid(), 1000) == mine
