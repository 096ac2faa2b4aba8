"""deploy.image's lock handling, without podman (fast): what the image installs is
resolved against the wheels it was given, every version the lock's, each wheel's hash
written for ``pip install --require-hashes`` (issue 27, blocker 2)."""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path

import pytest

from deploy.imagerun import REPO, ImageError
from deploy.wheels import LOCKS, normalize, prune_wheels, read_locks, write_requirements


def make_wheel(wheels: Path, name: str, version: str, *requires: str) -> Path:
    """A minimal pure-Python wheel (metadata only): enough for pip's resolver."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = wheels / f"{dist}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr(f"{dist}.dist-info/METADATA", metadata)
        whl.writestr(
            f"{dist}.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        whl.writestr(f"{dist}.dist-info/RECORD", "")
    return path


def _lock(path: Path, pins: dict[str, str]) -> Path:
    lines = [
        f"{n}=={v} \\\n    --hash=sha256:{'0' * 64}\n    # via strata" for n, v in pins.items()
    ]
    path.write_text("# a lock\n" + "\n".join(lines) + "\n")
    return path


def test_the_real_locks_parse() -> None:
    pins = read_locks([REPO / lock for lock in LOCKS["runtime"]])
    text = (REPO / "requirements.lock").read_text()
    assert len(pins) == text.count("==") > 30
    assert pins["fsspec"].version == pins["s3fs"].version  # released together
    assert all(len(pin.hashes) >= 1 for pin in pins.values())
    assert normalize("PyYAML") in pins and normalize("typing_extensions") in pins


def test_what_the_image_installs_is_the_lock(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    pins = read_locks([_lock(tmp_path / "r.lock", {"fsspec": "2026.1.0", "s3fs": "2026.1.0"})])
    make_wheel(wheels, "strata", "0.1.0", "s3fs>=2025.1", "fsspec>=2025.1")
    make_wheel(wheels, "fsspec", "2026.1.0")
    make_wheel(wheels, "s3fs", "2026.1.0", "fsspec==2026.1.0")
    stale = [make_wheel(wheels, "fsspec", "2026.9.0"), make_wheel(wheels, "s3fs", "2026.9.0")]
    # left by an earlier lock, the newest wheels would win the resolution
    with pytest.raises(ImageError, match=re.escape("the lock pins 2026.1.0")):
        write_requirements(wheels, pins)
    removed = prune_wheels(wheels, pins)
    assert sorted(removed) == sorted([*stale, wheels / "strata-0.1.0-py3-none-any.whl"])
    make_wheel(wheels, "strata", "0.1.0", "s3fs>=2025.1", "fsspec>=2025.1")  # rebuilt
    assert write_requirements(wheels, pins) == {
        "fsspec": "2026.1.0",
        "s3fs": "2026.1.0",
        "strata": "0.1.0",
    }
    locked = (wheels / "locked.txt").read_text().splitlines()[1:]
    digest = hashlib.sha256((wheels / "fsspec-2026.1.0-py3-none-any.whl").read_bytes())
    assert locked[0] == f"fsspec==2026.1.0 --hash=sha256:{digest.hexdigest()}"
    assert locked[1].startswith("s3fs==2026.1.0 --hash=sha256:") and len(locked) == 2
    project = (wheels / "project.txt").read_text().splitlines()[1:]
    assert len(project) == 1 and project[0].startswith("strata==0.1.0 --hash=sha256:")


def test_a_dependency_no_lock_pins_is_refused(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    pins = read_locks([_lock(tmp_path / "r.lock", {"fsspec": "2026.1.0"})])
    make_wheel(wheels, "strata", "0.1.0", "fsspec", "left-pad")
    make_wheel(wheels, "fsspec", "2026.1.0")
    make_wheel(wheels, "left-pad", "1.0")
    with pytest.raises(ImageError, match="left-pad, which no lock pins"):
        write_requirements(wheels, pins)


def test_locks_that_disagree_are_refused(tmp_path: Path) -> None:
    a = _lock(tmp_path / "a.lock", {"fsspec": "2026.1.0"})
    b = _lock(tmp_path / "b.lock", {"fsspec": "2026.9.0"})
    with pytest.raises(ImageError, match=re.escape("fsspec is 2026.1.0 in one lock, 2026.9.0")):
        read_locks([a, b])
