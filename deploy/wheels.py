"""The image's Python wheels (step 3 of :mod:`deploy.image`): the hashed locks each target
comes from (:data:`LOCKS`), wheels built on this machine by ``pip wheel`` and pruned to
the locks' versions, and what a target installs resolved against those wheels alone,
every version checked against the lock, written with each wheel's hash.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from deploy.imagerun import PROG, REPO, ImageError, sha256_file
from deploy.imagerun import run as _run

LOCKS = {
    "runtime": ("requirements.lock",),
    "trainer": ("requirements-torch.lock", "requirements-dev.lock"),
}
"""The hashed locks each target's wheels come from (``make lock`` writes them). torch is
the CPU build pinned in ``requirements-torch.lock``; where its wheel comes from is pip's
own configuration (a find-links directory) or ``$STRATA_TORCH_INDEX`` (for example
PyTorch's CPU package index), checked against the lock's hash either way."""
PROJECT = "strata"
EXTRAS = {"runtime": "", "trainer": "[train]"}
"""What each target installs: ``strata`` or ``strata[train]``."""


@dataclass(frozen=True)
class Pin:
    """A ``name==version`` line of a lock, with the artifact hashes it accepts."""

    version: str
    hashes: frozenset[str]


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them (``PyYAML`` -> ``pyyaml``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_locks(paths: list[Path]) -> dict[str, Pin]:
    """Every ``name==version`` of the hashed locks (``uv pip compile`` output), by
    normalized name.

    Raises:
        ImageError: two locks pin one package to different versions.
    """
    pins: dict[str, Pin] = {}
    for path in paths:
        text = path.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            line = line.partition("#")[0].strip()
            match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^]]*\])?==(\S+)", line)
            if not match:
                continue
            name, version = normalize(match.group(1)), match.group(3).rstrip(";")
            hashes = frozenset(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
            old = pins.get(name)
            if old is not None and old.version != version:
                raise ImageError(f"{name} is {old.version} in one lock, {version} in another")
            pins[name] = Pin(version, hashes | (old.hashes if old else frozenset()))
    return pins


def _wheel_name(path: Path) -> tuple[str, str]:
    """(normalized name, version) of a wheel file (``name-version-tags.whl``)."""
    name, version = path.name.split("-")[:2]
    return normalize(name), version


def prune_wheels(wheels: Path, pins: dict[str, Pin]) -> list[Path]:
    """Removes the wheels of versions the locks do not pin (left by an earlier lock) and
    every wheel of this project (rebuilt each time); returns what it removed."""
    removed = []
    for path in sorted(wheels.glob("*.whl")):
        name, version = _wheel_name(path)
        pin = pins.get(name)
        if name == PROJECT or pin is None or pin.version != version:
            path.unlink()
            removed.append(path)
    return removed


def resolve(wheels: Path, requirement: str) -> dict[str, Path]:
    """What ``pip install REQUIREMENT`` would install from ``wheels`` alone (no index, no
    configuration, nothing already installed counted): the wheel of each, by name.

    Raises:
        ImageError: pip found no consistent set in ``wheels``.
    """
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        args = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "-q"]
        args += ["--ignore-installed", "--no-index", "--find-links", str(wheels)]
        _run([*args, "--only-binary=:all:", "--report", str(report), requirement])
        installs = json.loads(report.read_text())["install"]
    out = {}
    for item in installs:
        url: str = item["download_info"]["url"]
        if not url.startswith("file://"):
            raise ImageError(f"pip would install {url}, not a wheel of {wheels}")
        out[normalize(item["metadata"]["name"])] = Path(url.removeprefix("file://"))
    return out


def write_requirements(wheels: Path, pins: dict[str, Pin], extra: str = "") -> dict[str, str]:
    """Resolves ``strata{extra}`` against ``wheels`` and writes what it needs, each with
    its wheel's hash: ``wheels/locked.txt`` (every dependency, each at its lock's version)
    and ``wheels/project.txt`` (this project's wheel). Returns the versions, by name.

    Raises:
        ImageError: a dependency is not in the locks or not at their version.
    """
    resolved = resolve(wheels, f"{PROJECT}{extra}")
    versions = {}
    lines: dict[str, list[str]] = {"locked.txt": [], "project.txt": []}
    for name, path in sorted(resolved.items()):
        wheel_name, version = _wheel_name(path)
        assert wheel_name == name, (name, path)
        if name != PROJECT:
            pin = pins.get(name)
            if pin is None:
                raise ImageError(f"{PROJECT}{extra} needs {name}, which no lock pins")
            if pin.version != version:
                raise ImageError(f"{name} {version} in {wheels}, the lock pins {pin.version}")
        line = f"{name}=={version} --hash=sha256:{sha256_file(path)}"
        lines["project.txt" if name == PROJECT else "locked.txt"].append(line)
        versions[name] = version
    if not lines["project.txt"]:
        raise ImageError(f"no wheel of {PROJECT} in {wheels}")
    for file, content in lines.items():
        header = f"# {file}: written by python -m {PROG} from the locks and the wheels here\n"
        (wheels / file).write_text(header + "\n".join(content) + "\n")
    return versions


def build_wheels(context: Path, trainer: bool) -> Path:
    """``pip wheel`` of the locked dependencies (hashes required, nothing resolved), then
    of this checkout, into the context; the Containerfile installs from these alone.

    Raises:
        ImageError: a ``pip wheel`` failed (a hash mismatch among them).
    """
    wheels = context / ("wheels-train" if trainer else "wheels")
    wheels.mkdir(parents=True, exist_ok=True)
    locks = [REPO / lock for lock in LOCKS["trainer" if trainer else "runtime"]]
    pins = read_locks(locks)
    for path in prune_wheels(wheels, pins):
        print(f"{PROG}: removed {path.name} (not in the locks)", file=sys.stderr)
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wheels)]
    locked = [*pip, "--require-hashes", "--no-deps"]
    if trainer and (index := os.environ.get("STRATA_TORCH_INDEX")):
        locked += ["--extra-index-url", index]
    for lock in locks:
        locked += ["-r", str(lock)]
    _run(locked)
    _run([*pip, "--no-deps", str(REPO)])
    write_requirements(wheels, pins, EXTRAS["trainer" if trainer else "runtime"])
    return wheels
