"""The image's native stage without podman (fast): what native/build.sh builds libfuse and
pyfuse3 from offline is checked by hash before anything is built, deploy.image rebuilds
the stage when any of its inputs changes and fetches again only what no longer checks
out, and the runtime stage takes only the results (issue 44, item 1)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import deploy.image as image
from deploy.image import (
    BASE_PACKAGES,
    BUILD_PACKAGES,
    CONTAINERFILE,
    NATIVE_DIR,
    NATIVE_FILES,
    fetch_native,
    native_key,
    native_stage_text,
)

BUILD_SH = NATIVE_DIR / "build.sh"
PYFUSE3_SDIST = "pyfuse3-3.5.0.tar.gz"


def _sources(root: Path, files: dict[str, bytes]) -> Path:
    """A sources directory as ``native/build.sh fetch`` leaves it: files and SHA256SUMS."""
    root.mkdir(parents=True)
    sums = []
    for name, data in files.items():
        (root / name).write_bytes(data)
        sums.append(f"{hashlib.sha256(data).hexdigest()}  {name}\n")
    (root / "SHA256SUMS").write_text("".join(sums))
    return root


def _offline(step: str, sources: Path, out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STRATA_NATIVE_SOURCES": str(sources)}
    return subprocess.run(
        [str(BUILD_SH), step, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_an_offline_libfuse_build_refuses_sources_that_differ_from_their_sums(
    tmp_path: Path,
) -> None:
    sources = _sources(tmp_path / "src", {"fuse3_3.17.2-3.dsc": b"dsc", "x.tar.xz": b"tar"})
    (sources / "x.tar.xz").write_bytes(b"tampered")
    done = _offline("libfuse", sources, tmp_path / "out")
    assert done.returncode == 1 and "does not match its SHA256SUMS" in done.stderr, done.stderr
    assert not (tmp_path / "out" / "libfuse").exists()
    (sources / "SHA256SUMS").unlink()
    done = _offline("libfuse", sources, tmp_path / "out")
    assert done.returncode == 1 and "SHA256SUMS missing" in done.stderr, done.stderr


def test_an_offline_pyfuse3_build_takes_only_the_pinned_sdist(tmp_path: Path) -> None:
    """An sdist other than build.sh's pin is refused even when SHA256SUMS (written on the
    host) agrees with it: the pin, not the fetch, decides."""
    out = tmp_path / "out"
    (out / "libfuse" / "lib" / "pkgconfig").mkdir(parents=True)
    (out / "libfuse" / "lib" / "pkgconfig" / "fuse3.pc").write_text("Version: 3.17.2\n")
    sources = _sources(tmp_path / "src", {PYFUSE3_SDIST: b"not the sdist"})
    done = _offline("pyfuse3", sources, out)
    assert done.returncode == 1, done.stderr
    assert "the pyfuse3 sdist's sha256 is not" in done.stderr, done.stderr
    assert not list(out.glob("wheels/*.whl"))


def test_the_pinned_sdist_hash_is_the_locks() -> None:
    pin = re.search(r"^PYFUSE3_SHA256=([0-9a-f]{64})", BUILD_SH.read_text(), re.M)
    assert pin is not None
    lock = (image.REPO / "requirements.lock").read_text().replace("\\\n", " ")
    line = next(x for x in lock.splitlines() if x.startswith("pyfuse3=="))
    assert pin.group(1) in line


def test_the_native_image_key_follows_every_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    native = tmp_path / "native"
    shutil.copytree(NATIVE_DIR, native)
    monkeypatch.setattr(image, "NATIVE_DIR", native)
    sources = _sources(tmp_path / "src", {PYFUSE3_SDIST: b"sdist"})
    key = native_key(sources, "sha256:" + "1" * 64)
    assert re.fullmatch(r"[0-9a-f]{16}", key)
    assert native_key(sources, "sha256:" + "1" * 64) == key  # same inputs, same image
    assert native_key(sources, "sha256:" + "2" * 64) != key  # another build base
    (sources / "SHA256SUMS").write_text(f"{'0' * 64}  fuse3_3.17.3-1.dsc\n")
    assert native_key(sources, "sha256:" + "1" * 64) != key  # other sources
    (sources / "SHA256SUMS").write_text(
        f"{hashlib.sha256(b'sdist').hexdigest()}  {PYFUSE3_SDIST}\n"
    )
    assert native_key(sources, "sha256:" + "1" * 64) == key
    with (native / "pyfuse3-passthrough.patch").open("a") as f:
        f.write("\n")
    assert native_key(sources, "sha256:" + "1" * 64) != key  # another patch


def test_verified_sources_are_kept_and_others_fetched_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(image, "_run", calls.append)
    context = tmp_path / "context"
    sources = _sources(context / "native-src", {PYFUSE3_SDIST: b"sdist"})
    (context / "native-src.inputs").write_text(image._native_inputs())
    assert fetch_native(context) == sources
    assert calls == []  # every file checks out: nothing fetched
    assert sorted(p.name for p in (context / "native").iterdir()) == sorted(NATIVE_FILES)
    assert os.access(context / "native" / "build.sh", os.X_OK)
    (sources / PYFUSE3_SDIST).write_bytes(b"changed")
    fetch_native(context)
    assert calls == [[str(BUILD_SH), "fetch", str(sources)]]
    (sources / PYFUSE3_SDIST).write_bytes(b"sdist")
    (context / "native-src.inputs").write_text("an older build.sh")
    fetch_native(context)
    assert len(calls) == 2  # native/ fetches differently now


def _stages(text: str) -> dict[str, str]:
    """Each stage of a Containerfile by its name: its FROM line and what follows."""
    parts = re.split(r"^(?=FROM )", text, flags=re.M)
    out = {}
    for part in parts[1:]:
        name = re.match(r"FROM \S+ AS (\S+)", part)
        assert name is not None, part[:80]
        out[name.group(1)] = part
    return out


def test_the_runtime_takes_only_the_native_results_and_no_compiler() -> None:
    stages = _stages(CONTAINERFILE.read_text())
    assert native_stage_text() == stages["native-build"]
    assert stages["native-build"].startswith("FROM ${BUILD_BASE} AS native-build")
    assert (
        "STRATA_NATIVE_SOURCES=/src/sources /src/native/build.sh libfuse" in stages["native-build"]
    )
    assert (
        "STRATA_NATIVE_SOURCES=/src/sources /src/native/build.sh pyfuse3" in stages["native-build"]
    )
    for name in ("build", "runtime"):
        assert stages[name].startswith(f"FROM ${{BASE}} AS {name}")
    copied = re.findall(r"^COPY --from=native (\S+) ", stages["runtime"], re.M)
    assert copied == ["/opt/strata-native/libfuse/lib/", "/opt/strata-native/SOURCES"]
    # the patched wheel goes in by its hash, over the lock's pyfuse3
    assert "--require-hashes --no-deps" in stages["build"]
    assert "-r /native-wheels/native.txt" in stages["build"]
    compilers = {"gcc", "meson", "ninja-build", "dpkg-dev", "python3-dev", "libc6-dev"}
    assert compilers <= set(BUILD_PACKAGES)
    assert not compilers & set(BASE_PACKAGES)
