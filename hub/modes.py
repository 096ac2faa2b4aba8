"""Owner-only modes for what the hub writes: 0700 directories, 0600 files.

The hub's files are private to its user (:mod:`hub.store.datadir` says why); new ones are made
with these modes explicitly, and :func:`hub.store.datadir.secure` (over
:mod:`strata_local.ownership`)
refuses a directory another user could change and narrows what exists.
"""

from __future__ import annotations

DIR_MODE = 0o700
FILE_MODE = 0o600
PRIVATE_UMASK = 0o077
"""The umask of every ``strata-hub`` command: anything made without an explicit mode is
owner-only too."""
