"""The spoke's audit trail: one JSON object per line, appended to ``CACHE_DIR/audit.jsonl``
(or ``--audit-log FILE``), mode 0600.

Each record says when (``ts``, ISO 8601 UTC), who (``who``: the admin client's address, or
``daemon`` for the spoke's own actions such as retention and revocation purges), what
(``what``: the call, e.g. ``POST /v1/pins``, plus the names it was given) and the outcome
(``outcome``: the HTTP status, or why it was refused). Tokens and other secrets are never
written. Lines are written whole with one ``write(2)`` in append mode, so concurrent writers
and a crash leave no torn records; the file is meant for log shippers (rotate it with
``copytruncate``).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)


class AuditLog:
    """Appends audit records to a JSON-lines file.

    Args:
        path: the file (created 0600 if missing).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def record(self, *, who: str, what: str, outcome: str, **details: object) -> None:
        """Write one record; an I/O error is logged, never raised (auditing must not take
        the admin API down)."""
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
                os.write(self._fd, line)
            except OSError as err:
                log.error("audit log %s: %s", self.path, err.strerror)

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)
