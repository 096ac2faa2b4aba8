"""Build Strata's container image without any image registry.

    python -m deploy.image [--target runtime|trainer] [--tag 0.1.0] [--context build/image]

Three steps, each skipped when its output is already there:

1. the Debian base image ``localhost/strata-base:bookworm``: ``mmdebstrap`` (minbase,
   with python3, python3-venv, fuse3 and ca-certificates) writes a root filesystem
   tarball, ``podman import`` turns it into an image;
2. wheels of Strata and its dependencies, built on this machine by ``pip wheel`` into
   ``CONTEXT/wheels``, exactly the versions of ``requirements.lock`` with their hashes
   checked (``CONTEXT/wheels-train`` for the trainer: ``requirements-torch.lock``, the CPU
   build of torch, and ``requirements-dev.lock``, which holds the ``train`` extra's
   dependencies; torch from pip's configured find-links or ``$STRATA_TORCH_INDEX``); later
   runs reuse what is there;
3. ``podman build --network=host`` of deploy/Containerfile's ``--target`` stage,
   tagged ``localhost/strata:TAG`` (``localhost/strata-train:TAG`` for the trainer).

The host network is used on purpose: podman's default bridge hands out private-range
addresses, and the build needs no network at all (pip installs from the wheels only).
Exit status 0 on success, 1 when a step fails (its output is shown), 2 when a tool is
missing.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

PROG = "deploy.image"
REPO = Path(__file__).resolve().parent.parent
CONTAINERFILE = REPO / "deploy" / "Containerfile"
BASE = "localhost/strata-base:bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "fuse3", "ca-certificates")
LOCKS = {
    "runtime": ("requirements.lock",),
    "trainer": ("requirements-torch.lock", "requirements-dev.lock"),
}
"""The hashed locks each target's wheels come from (``make lock`` writes them). torch is
the CPU build pinned in ``requirements-torch.lock``; where its wheel comes from is pip's
own configuration (a find-links directory) or ``$STRATA_TORCH_INDEX`` (for example
PyTorch's CPU package index), checked against the lock's hash either way."""
VERSION = "0.1.0"


class ImageError(RuntimeError):
    """A build step failed; the message says which."""


def ulimit_args() -> list[str]:
    """``--ulimit`` flags within this process's own hard limits.

    podman's defaults (nofile 1048576, nproc the host's) are refused by runc where the
    engine itself runs under lower limits or without CAP_SYS_RESOURCE (``error setting
    rlimit ... operation not permitted``), as in sandboxes and CI runners.
    """
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    return [f"--ulimit=nofile={nofile}:{nofile}", "--ulimit=nproc=4096:4096"]


def _run(args: list[str]) -> None:
    print(f"{PROG}: $ {' '.join(args)}", file=sys.stderr, flush=True)
    if subprocess.run(args, check=False).returncode != 0:
        raise ImageError(f"{args[0]} {args[1]} failed")


def _exists(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image], check=False).returncode == 0


def ensure_base(context: Path, image: str = BASE) -> None:
    """Makes the Debian base image with mmdebstrap unless podman already has it."""
    if _exists(image):
        return
    tarball = context / "base.tar"
    _run(
        [
            "mmdebstrap",
            "--variant=minbase",
            "--mode=root",
            "--format=tar",
            f"--include={','.join(BASE_PACKAGES)}",
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


def build_wheels(context: Path, trainer: bool) -> Path:
    """``pip wheel`` of the locked dependencies (hashes required, nothing resolved), then
    of this checkout, into the context; the Containerfile installs from these alone.

    Raises:
        ImageError: a ``pip wheel`` failed (a hash mismatch among them).
    """
    wheels = context / ("wheels-train" if trainer else "wheels")
    wheels.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wheels)]
    locked = [*pip, "--require-hashes", "--no-deps"]
    if trainer and (index := os.environ.get("STRATA_TORCH_INDEX")):
        locked += ["--extra-index-url", index]
    for lock in LOCKS["trainer" if trainer else "runtime"]:
        locked += ["-r", str(REPO / lock)]
    _run(locked)
    _run([*pip, "--no-deps", str(REPO)])
    return wheels


def build(target: str, tag: str, context: Path) -> str:
    """All three steps; returns the image name.

    Raises:
        ImageError: a step failed.
    """
    context.mkdir(parents=True, exist_ok=True)
    ensure_base(context)
    trainer = target == "trainer"
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
            f"--build-arg=BASE={BASE}",
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
        image = build(args.target, args.tag, args.context)
    except ImageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(image)
    return 0


if __name__ == "__main__":
    sys.exit(main())
