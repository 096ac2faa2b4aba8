"""Files that appear whole or not at all: a temporary file beside the target, fsynced, renamed.

Used by the hub for blocks, managed token files and ``serve --port-file``, by the spoke for its
generated admin token and by the CSI plugin for its publication records. A reader sees the old
file or the new one, never a part; a writer that fails or is interrupted removes its temporary
file. The rename is not durable until the directory is fsynced too, which callers that need it
do themselves (the hub's local blob store batches that for many blocks).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes, *, prefix: str | None = None) -> None:
    """Replaces ``path`` with a file holding ``data``, mode 0600.

    Args:
        path: The file; its directory must exist.
        data: Its new contents.
        prefix: How the temporary file's name starts (``.NAME.`` by default), so that a
            directory's owner can recognise, and clean up, what a crashed writer left.

    Raises:
        OSError: The file could not be written, synced or renamed; nothing is left behind.
    """
    fd, temp = tempfile.mkstemp(prefix=prefix or f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
