"""Build Strata's container image without any image registry.

    python -m deploy.image [--target runtime|trainer] [--tag 0.1.0] [--context build/image]

Four steps, each skipped when its output is already there:

1. the Debian base images ``localhost/strata-base:bookworm`` and, for the native stage
   only, ``localhost/strata-build-base:bookworm`` (the same with a C compiler, meson,
   ninja, dpkg-dev and Python's headers): ``mmdebstrap`` (minbase, with python3,
   python3-venv, fuse3 and ca-certificates; apt checks every package) writes a root
   filesystem tarball, ``podman import`` turns it into an image. The build then uses the
   base by its content digest (``localhost/strata-base@sha256:…``, recorded in the
   image's ``org.opencontainers.image.base.digest`` label); ``--base-digest`` (or
   ``$STRATA_BASE_DIGEST``) refuses any other base, so a vetted base stays the base;
2. what FUSE passthrough and mount hand-over need (native/DESIGN.md): ``native/build.sh
   fetch`` on this machine fetches the fuse3 source package (apt: the signed Sources
   index, each file's hash), the pyfuse3 sdist and the wheels of
   ``native/build-requirements.txt`` (pip, ``--require-hashes``) into ``CONTEXT/native-src``
   with their hashes in ``SHA256SUMS``; the Containerfile's ``native-build`` stage checks
   them again and runs ``native/build.sh libfuse`` and ``pyfuse3`` offline (libfuse >=
   3.17, pyfuse3 with ``native/pyfuse3-passthrough.patch``), tagged
   ``localhost/strata-native:KEY``, KEY a hash of native/, the sources' hashes, that
   stage's text and the build base's digest: built once per change of any of them. The
   runtime image copies only its results (libfuse's shared library, the pyfuse3 wheel
   installed over the lock's): no compiler, no headers;
3. wheels of Strata and its dependencies (:mod:`deploy.wheels`), built on this machine by
   ``pip wheel`` into ``CONTEXT/wheels``, exactly the versions of ``requirements.lock``
   with their hashes checked (``CONTEXT/wheels-train`` for the trainer:
   ``requirements-torch.lock``, the CPU build of torch, and ``requirements-dev.lock``,
   which holds the ``train`` extra's dependencies; torch from pip's configured find-links
   or ``$STRATA_TORCH_INDEX``); later runs reuse what is there, less any wheel of a version
   the locks no longer pin. What the target installs is then resolved against those
   wheels alone, every version checked against the lock, and written with each wheel's
   own hash to ``locked.txt`` (the dependencies) and ``project.txt`` (Strata) in the wheel
   directory: the Containerfile installs the first with ``--require-hashes`` and the
   second with ``--no-deps``;
4. ``podman build --network=host`` of deploy/Containerfile's ``--target`` stage,
   tagged ``localhost/strata:TAG`` (``localhost/strata-train:TAG`` for the trainer), with
   the OCI labels ``org.opencontainers.image.version`` (the project's version),
   ``revision`` (the git commit, ``-dirty`` with uncommitted changes), ``created``
   (``$SOURCE_DATE_EPOCH`` or now) and ``source`` (``--source``, else the ``origin``
   remote, else this checkout's ``file://`` path).

The host network is used on purpose: podman's default bridge hands out private-range
addresses, and the build needs no network at all (pip installs from the wheels only, the
native stage builds from the fetched sources).
Exit status 0 on success, 1 when a step fails (its output is shown), 2 when a tool is
missing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import resource
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from deploy.imagerun import PROG, REPO, ImageError, sha256_file
from deploy.imagerun import run as _run
from deploy.wheels import build_wheels

CONTAINERFILE = REPO / "deploy" / "Containerfile"
BASE = "localhost/strata-base:bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "fuse3", "ca-certificates")
BUILD_BASE = "localhost/strata-build-base:bookworm"
BUILD_PACKAGES = (
    *BASE_PACKAGES,
    *("python3-dev", "gcc", "libc6-dev", "pkg-config", "meson", "ninja-build"),
    *("dpkg-dev", "patch", "xz-utils"),
)
"""The native stage's base: what ``native/build.sh`` needs to build libfuse and pyfuse3."""
NATIVE = "localhost/strata-native"
NATIVE_DIR = REPO / "native"
NATIVE_FILES = ("build.sh", "pyfuse3-passthrough.patch", "build-requirements.txt")
"""What the native stage runs (copied into ``CONTEXT/native``)."""
NATIVE_STAGE = "native-build"
VERSION = "0.1.0"


def ulimit_args() -> list[str]:
    """``--ulimit`` flags within this process's own hard limits.

    podman's defaults (nofile 1048576, nproc the host's) are refused by runc where the
    engine itself runs under lower limits or without CAP_SYS_RESOURCE (``error setting
    rlimit ... operation not permitted``), as in sandboxes and CI runners.
    """
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    return [f"--ulimit=nofile={nofile}:{nofile}", "--ulimit=nproc=4096:4096"]


def _exists(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image], check=False).returncode == 0


def ensure_base(
    context: Path, image: str = BASE, packages: tuple[str, ...] = BASE_PACKAGES
) -> None:
    """Makes a Debian base image with mmdebstrap unless podman already has it."""
    if _exists(image):
        return
    tarball = context / "base.tar"
    _run(
        [
            "mmdebstrap",
            "--variant=minbase",
            "--mode=root",
            "--format=tar",
            f"--include={','.join(packages)}",
            '--aptopt=Acquire::Languages "none"',
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            "bookworm",
            str(tarball),
            *(f"deb {uri} {suite} main" for suite, uri in debian_archives().items()),
        ]
    )
    try:
        _run(["podman", "import", "--change", 'CMD ["/bin/bash"]', str(tarball), image])
    finally:
        tarball.unlink(missing_ok=True)


def debian_archives() -> dict[str, str]:
    """The archive URI of each suite the base image installs from (bookworm and
    bookworm-security), as this machine's apt sources name them (``apt-get
    indextargets``), so the image comes from the archives the host already trusts.

    Raises:
        ImageError: apt's sources name no archive for one of the suites.
    """
    out = subprocess.run(
        ["apt-get", "indextargets", "--format", "$(RELEASE) $(REPO_URI)"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    found: dict[str, str] = {}
    for line in out.splitlines():
        suite, _, uri = line.partition(" ")
        found.setdefault(suite, uri.rstrip("/"))
    wanted = ("bookworm", "bookworm-security")
    missing = [suite for suite in wanted if suite not in found]
    if missing:
        raise ImageError(f"apt's sources name no archive for {', '.join(missing)}")
    return {suite: found[suite] for suite in wanted}


def _sums(path: Path) -> dict[str, str]:
    """The ``sha256  file`` lines of a SHA256SUMS file, by file name."""
    out = {}
    for line in path.read_text().splitlines():
        digest, _, name = line.partition("  ")
        out[name] = digest
    return out


def _native_inputs() -> str:
    """A hash of what ``native/build.sh fetch`` fetches by (the script, the build
    requirements): fetched sources of other inputs are fetched again."""
    digest = hashlib.sha256()
    for name in ("build.sh", "build-requirements.txt"):
        digest.update(name.encode() + b"\0" + (NATIVE_DIR / name).read_bytes() + b"\0")
    return digest.hexdigest()


def fetch_native(context: Path) -> Path:
    """``CONTEXT/native-src``: the sources of libfuse and pyfuse3 and the wheels that build
    them, fetched by ``native/build.sh fetch`` (apt's signed index and pip's
    ``--require-hashes`` check them), kept while every file matches its SHA256SUMS line
    and native/ fetches the same; and ``CONTEXT/native``: native/'s files the stage runs.

    Raises:
        ImageError: the fetch failed (a hash mismatch, no archive, no network).
    """
    sources = context / "native-src"
    stamp = context / "native-src.inputs"
    sums = sources / "SHA256SUMS"
    fresh = stamp.exists() and stamp.read_text() == _native_inputs() and sums.exists()
    if fresh:
        fresh = all(
            (sources / name).is_file() and sha256_file(sources / name) == digest
            for name, digest in _sums(sums).items()
        )
    if not fresh:
        stamp.unlink(missing_ok=True)
        _run([str(NATIVE_DIR / "build.sh"), "fetch", str(sources)])
        stamp.write_text(_native_inputs())
    scripts = context / "native"
    shutil.rmtree(scripts, ignore_errors=True)
    scripts.mkdir()
    for name in NATIVE_FILES:
        shutil.copy2(NATIVE_DIR / name, scripts / name)
    return sources


def native_stage_text(containerfile: Path = CONTAINERFILE) -> str:
    """The Containerfile's native-build stage, from its ``FROM`` to the next ``FROM``."""
    text = containerfile.read_text()
    match = re.search(rf"^FROM \S+ AS {NATIVE_STAGE}\n.*?(?=^FROM )", text, re.M | re.S)
    if match is None:
        raise ImageError(f"{containerfile} has no {NATIVE_STAGE} stage")
    return match.group(0)


def native_key(sources: Path, build_base: str) -> str:
    """What the native image is built from, as one hash: native/'s files, the fetched
    sources' hashes, the stage's text and the build base's digest."""
    digest = hashlib.sha256()
    parts = [(NATIVE_DIR / name).read_bytes() for name in NATIVE_FILES]
    parts += [(sources / "SHA256SUMS").read_bytes(), native_stage_text().encode()]
    parts.append(build_base.encode())
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


def ensure_native(context: Path) -> str:
    """The native image (``localhost/strata-native:KEY``: libfuse >= 3.17 and the patched
    pyfuse3's wheel under /opt/strata-native), built from the fetched sources unless
    podman has it already; returns its name.

    Raises:
        ImageError: a step failed.
    """
    sources = fetch_native(context)
    ensure_base(context, BUILD_BASE, BUILD_PACKAGES)
    digest = base_digest(BUILD_BASE)
    image = f"{NATIVE}:{native_key(sources, digest)}"
    if _exists(image):
        return image
    _run(
        [
            "podman",
            "build",
            "--network=host",
            *ulimit_args(),
            f"--target={NATIVE_STAGE}",
            "--pull=never",
            f"--build-arg=BUILD_BASE={BUILD_BASE.rpartition(':')[0]}@{digest}",
            f"--tag={image}",
            f"--file={CONTAINERFILE}",
            str(context),
        ]
    )
    return image


def base_digest(image: str = BASE) -> str:
    """The manifest digest (``sha256:…``) of a local image.

    Raises:
        ImageError: podman has no such image, or it has no digest.
    """
    out = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Digest}}", image],
        capture_output=True,
        text=True,
        check=False,
    )
    digest = out.stdout.strip()
    if out.returncode != 0 or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise ImageError(f"no digest for {image}: {out.stderr.strip() or digest}")
    return digest


def _git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def labels(source: str | None = None) -> dict[str, str]:
    """The OCI labels (annotations spec: version, revision, created, source) of an image
    built from this checkout now."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    revision = _git("rev-parse", "HEAD") or "unknown"
    if revision != "unknown" and _git("status", "--porcelain", "--untracked-files=no"):
        revision += "-dirty"
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    created = time.gmtime(int(epoch) if epoch else None)
    origin = _git("remote", "get-url", "origin")
    return {
        "org.opencontainers.image.version": project["version"],
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.created": time.strftime("%Y-%m-%dT%H:%M:%SZ", created),
        "org.opencontainers.image.source": source or origin or REPO.as_uri(),
    }


def build(
    target: str,
    tag: str,
    context: Path,
    want_base: str | None = None,
    source: str | None = None,
) -> str:
    """All four steps; returns the image name. ``want_base``: the only base digest to
    accept (default ``$STRATA_BASE_DIGEST``, else whatever the base is).

    Raises:
        ImageError: a step failed, or the base is not ``want_base``.
    """
    context.mkdir(parents=True, exist_ok=True)
    ensure_base(context)
    digest = base_digest(BASE)
    want_base = want_base or os.environ.get("STRATA_BASE_DIGEST") or None
    if want_base is not None and want_base != digest:
        raise ImageError(f"{BASE} is {digest}, not the pinned {want_base}")
    base = f"{BASE.rpartition(':')[0]}@{digest}"
    trainer = target == "trainer"
    native = [] if trainer else [f"--build-arg=NATIVE={ensure_native(context)}"]
    build_wheels(context, trainer)
    for name in ("wheels", "wheels-train"):  # the other stage's COPY needs its directory
        (context / name).mkdir(exist_ok=True)
    image = f"localhost/{'strata-train' if trainer else 'strata'}:{tag}"
    _run(
        [
            "podman",
            "build",
            "--network=host",
            *ulimit_args(),
            f"--target={target}",
            "--pull=never",
            "--no-cache",  # a cached image keeps an earlier build's labels (podman 4.3)
            f"--build-arg=BASE={base}",
            *native,
            *(f"--label={key}={value}" for key, value in labels(source).items()),
            f"--label=org.opencontainers.image.base.name={BASE}",
            f"--label=org.opencontainers.image.base.digest={digest}",
            f"--tag={image}",
            f"--file={CONTAINERFILE}",
            str(context),
        ]
    )
    return image


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__)
    parser.add_argument("--target", choices=("runtime", "trainer"), default="runtime")
    parser.add_argument("--tag", default=VERSION, help=f"image tag (default {VERSION})")
    parser.add_argument("--context", type=Path, default=REPO / "build" / "image")
    parser.add_argument(
        "--base-digest",
        help="refuse a base image of another digest (default $STRATA_BASE_DIGEST)",
    )
    parser.add_argument("--source", help="org.opencontainers.image.source (default: origin)")
    args = parser.parse_args(argv)
    missing = [tool for tool in ("podman", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        print(
            f"{PROG}: error: {', '.join(missing)} not found "
            "(Debian: apt-get install podman buildah mmdebstrap runc)",
            file=sys.stderr,
        )
        return 2
    if args.tag == "latest":
        print(f"{PROG}: error: tag a version, not 'latest'", file=sys.stderr)
        return 2
    try:
        image = build(args.target, args.tag, args.context, args.base_digest, args.source)
    except ImageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(image)
    return 0


if __name__ == "__main__":
    sys.exit(main())
