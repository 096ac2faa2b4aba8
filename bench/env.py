"""The machine and the versions a benchmark ran with (recorded in every result)."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from bench import fio
from bench.mounts import tool_version

REPO_ROOT = Path(__file__).resolve().parent.parent


def machine_info() -> dict[str, Any]:
    """CPU, cores, memory, OS and kernel of this machine, and how loaded it was.

    ``shared`` is true when the 1-minute load average exceeds half the cores: the
    figures then compete with other work.
    """
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        memory = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    os_name = platform.platform()
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"')
    load = os.getloadavg()[0]
    return {
        "cpu": cpu,
        "cores": os.cpu_count() or 1,
        "memory_gib": memory,
        "os": os_name,
        "kernel": platform.release(),
        "load_1min_at_start": load,
        "shared": load > 0.5 * (os.cpu_count() or 1),
    }


def versions() -> dict[str, str]:
    """Versions of Strata (with its git commit), Python and every tool involved
    (``""`` for what is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as pkg_version

    def pkg(name: str) -> str:
        try:
            return pkg_version(name)
        except PackageNotFoundError:
            return ""

    commit = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "strata": f"{pkg('strata')} ({commit})" if commit else pkg("strata"),
        "python": platform.python_version(),
        "torch": pkg("torch"),
        "zarr": pkg("zarr"),
        "fio": fio.version(),
        "rclone": tool_version("rclone"),
        "httpdirfs": tool_version("httpdirfs"),
        "fusermount3": tool_version("fusermount3"),
    }
