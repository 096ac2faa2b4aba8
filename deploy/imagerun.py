"""What every step of the image build (:mod:`deploy.image`, :mod:`deploy.wheels`) shares:
the program's name and the checkout's root, :class:`ImageError`, :func:`run` (a logged
command whose failure raises it) and :func:`sha256_file`.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

PROG = "deploy.image"
REPO = Path(__file__).resolve().parent.parent


class ImageError(RuntimeError):
    """A build step failed; the message says which."""


def run(args: list[str]) -> None:
    """Run ``args`` (echoed on stderr); a non-zero exit raises :class:`ImageError`."""
    print(f"{PROG}: $ {' '.join(args)}", file=sys.stderr, flush=True)
    if subprocess.run(args, check=False).returncode != 0:
        raise ImageError(f"{args[0]} {args[1]} failed")


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file's bytes, hex."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
