"""The hub's audit trail: one JSON object per line (``DATA_DIR/audit.jsonl`` by default, or
``$STRATA_HUB_AUDIT_LOG``), mode 0600.

Recorded: every refused call of ``serve`` (UNAUTHENTICATED, PERMISSION_DENIED; ``who`` is
the caller's address and, when the token was valid, its id) and every command that changes
the catalog or the tokens (``publish``, ``tag``, ``untag``, ``revoke``, ``gc``, ``token
create|revoke|migrate``; ``who`` is the operating-system user). ``what`` is the call or the
command line, ``outcome`` ``ok``, the status code, or the error. Secrets never appear: the
hub never receives one on a command line, and presented tokens are not written.

Each line is one ``write(2)`` in append mode (no torn records between processes). An audit
file that cannot be opened or written is logged as an error and never stops the hub.
"""

from __future__ import annotations

import datetime
import getpass
import json
import logging
import os
import threading
from pathlib import Path

logger = logging.getLogger(__name__)

ENV = "STRATA_HUB_AUDIT_LOG"
"""Variable naming the audit file, overriding the default location."""


def operator() -> str:
    """The operating-system user running this process (``uid N`` if it has no name)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


class AuditLog:
    """Appends audit records to a JSON-lines file.

    Args:
        path: the file (``$STRATA_HUB_AUDIT_LOG`` wins when set).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(os.environ.get(ENV) or path)
        self._lock = threading.Lock()
        self._fd: int | None = None

    def record(self, *, who: str, what: str, outcome: str, **details: object) -> None:
        """Write one record, opening the file on first use (errors are logged, never
        raised)."""
        entry = {
            "ts": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
            "who": who,
            "what": what,
            "outcome": outcome,
            **details,
        }
        line = (json.dumps(entry, default=str, separators=(",", ":")) + "\n").encode()
        with self._lock:
            try:
                if self._fd is None:
                    self._fd = os.open(
                        self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
                    )
                os.write(self._fd, line)
            except OSError as exc:
                logger.error("audit log %s: %s", self.path, exc.strerror)

    def close(self) -> None:
        """Close the file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
