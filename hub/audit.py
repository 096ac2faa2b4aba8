"""The hub's audit trail: one JSON object per line (``DATA_DIR/audit.jsonl`` by default, or
``$STRATA_HUB_AUDIT_LOG``, or ``serve --audit-log FILE``), mode 0600, rotated by size
(``--audit-max-bytes``, ``--audit-backups``; :mod:`strata_local.audit` does the writing).

Recorded: every refused call of ``serve`` (UNAUTHENTICATED, PERMISSION_DENIED; ``who`` is
the caller's address and, when the token was valid, its id), rate-limited with a summary of
what was left out (:meth:`AuditLog.refused`), and every command that changes the catalog or
the tokens (``publish``, ``tag``, ``untag``, ``revoke``, ``gc``, ``token
create|revoke|migrate``; ``who`` is the operating-system user; never dropped). ``what`` is
the call or the command line, ``outcome`` ``ok``, the status code, or the error. Every
string is cut to a few hundred characters. Secrets never appear: the hub never receives one
on a command line, and presented tokens are not written.

An audit file that cannot be opened or written is logged as an error and never stops the hub.
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path

import strata_local.audit
from strata_local.audit import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES

__all__ = ["DEFAULT_BACKUPS", "DEFAULT_MAX_BYTES", "ENV", "AuditLog", "operator"]

ENV = "STRATA_HUB_AUDIT_LOG"
"""Variable naming the audit file, overriding the default location."""


def operator() -> str:
    """The operating-system user running this process (``uid N`` if it has no name)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


class AuditLog(strata_local.audit.AuditLog):
    """The hub's audit file (:class:`strata_local.audit.AuditLog`); ``$STRATA_HUB_AUDIT_LOG``
    wins over ``path`` when set.

    Args:
        path: The file.
        max_bytes: Rotate before the file passes this size, bytes.
        backups: Rotated files kept.
    """

    def __init__(
        self, path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS
    ) -> None:
        super().__init__(Path(os.environ.get(ENV) or path), max_bytes=max_bytes, backups=backups)
