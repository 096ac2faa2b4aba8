"""What a benchmark reads of a running hub or spoke from outside: a process's CPU seconds
and resident memory from ``/proc``, a spoke's daemon and mount pids under its supervisor,
and every sample of a Prometheus endpoint (with a sum over some of them). Nothing here
starts or stops a process; :mod:`bench.small_files` times its passes with these."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape(
    url: str, headers: dict[str, str] | None = None
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus endpoint, by name and labels (``headers``: a spoke's
    admin token, which its admin port's ``/metrics`` needs)."""
    text = httpx.get(url, headers=headers, timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def total(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spoke_processes(supervisor: int) -> dict[str, int]:
    """The daemon's and the mount's pids: the children of ``strata-spoke run``."""
    out: dict[str, int] = {}
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    for pid in map(int, children):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"daemon" in argv:
            out["daemon"] = pid
        elif any(a.startswith(b"fusemount") or b"mount-" in a for a in argv):
            out["mount"] = pid
    return out


def rss_bytes(pid: int) -> int:
    """``VmRSS`` of process ``pid``, bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
