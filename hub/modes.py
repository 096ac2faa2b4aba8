"""Owner-only modes for what the hub writes: 0700 directories, 0600 files.

The hub's files are private to its user (:mod:`hub.datadir` says why); new ones are made
with these modes explicitly, and :func:`tighten` narrows what exists.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
PRIVATE_UMASK = 0o077
"""The umask of every ``strata-hub`` command: anything made without an explicit mode is
owner-only too."""


def tighten(path: Path, mode: int) -> None:
    """Clear the permission bits of ``path`` that ``mode`` lacks, if this user owns it.

    Links are never followed, nothing another user owns is changed, and a missing path is
    no error.

    Raises:
        OSError: ``path`` cannot be examined or changed.
    """
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
            return
        if stat.S_IMODE(st.st_mode) & ~mode:
            os.chmod(path, stat.S_IMODE(st.st_mode) & mode)
