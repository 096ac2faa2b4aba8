"""An audit trail in bounded space: JSON lines, rotated by size, refusals rate-limited.

The one implementation behind :mod:`hub.audit` and :mod:`spoke.audit` (hub and spoke
never import each other, so what both need lives here; it imports nothing of Strata).

- **One JSON object per line**: ``ts`` (ISO 8601 UTC, milliseconds), ``who``, ``what``,
  ``outcome`` and whatever details the caller adds. Every string value is cut to
  :data:`FIELD_CHARS` characters, with its full length noted (``"/v1/xxxx…[60000
  chars]"``), so no caller can make one record large.
- **Rotation by size and count** (:class:`logging.handlers.RotatingFileHandler`): when
  the file would pass ``max_bytes`` it becomes ``FILE.1`` (``FILE.1`` becomes ``FILE.2``,
  ...) and at most ``backups`` old files are kept, so the trail never takes more than
  ``max_bytes × (backups + 1)`` bytes plus one record. Every file, the rotated ones too,
  is created mode 0600 (and an existing one is made 0600).
- **Refusals are rate-limited** (:meth:`AuditLog.refused`): a token bucket admits
  ``refusals_per_s`` on average with bursts of ``burst``; the rest are counted, and a
  record ``{"what": "audit", "outcome": "suppressed", "suppressed": N, "by_outcome":
  {...}}`` says how many were left out, at most every :data:`SUMMARY_S` seconds while a
  flood lasts and when the log closes. Records of what was done (:meth:`AuditLog.record`)
  are never dropped.

Each record is one ``write(2)`` in append mode, so writers in several processes (the hub's
server and its one-shot commands) do not tear each other's records. An audit file that
cannot be opened or written is logged as an error and never stops the caller.
"""

from __future__ import annotations

import datetime
import io
import json
import logging
import logging.handlers
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "DEFAULT_BACKUPS",
    "DEFAULT_BURST",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_REFUSALS_PER_S",
    "FIELD_CHARS",
    "SUMMARY_S",
    "AuditLog",
    "TokenBucket",
    "truncate",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 16 << 20
"""A file is rotated before it grows past this many bytes (16 MiB)."""

DEFAULT_BACKUPS = 4
"""Rotated files kept beside the current one (so 80 MiB at most by default)."""

DEFAULT_REFUSALS_PER_S = 10.0
"""Refusal records written per second on average, beyond the burst."""

DEFAULT_BURST = 50
"""Refusal records written at once before the rate applies."""

FIELD_CHARS = 256
"""Longest string value written as is, characters; longer ones are cut and their length
noted."""

SUMMARY_S = 10.0
"""While refusals are suppressed, a summary record is written at most this often,
seconds."""

MAX_OUTCOMES = 16
"""Distinct outcomes counted separately in a summary; the rest are counted as ``other``."""


def truncate(value: str, limit: int = FIELD_CHARS) -> str:
    """``value`` if it has at most ``limit`` characters, else its first ``limit``
    characters and its length (``"abc…[60000 chars]"``)."""
    if len(value) <= limit:
        return value
    return f"{value[:limit]}…[{len(value)} chars]"


def _bounded(value: object) -> object:
    """A JSON-ready value whose strings are cut to :data:`FIELD_CHARS`."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return truncate(value)
    if isinstance(value, list | tuple) and len(value) <= 16:
        return [_bounded(v) for v in value]
    if isinstance(value, list | tuple | set | frozenset):
        return f"{len(value)} items"
    return truncate(str(value))


class TokenBucket:
    """A token bucket: ``rate`` admissions per second on average, ``burst`` at once.

    The classic shaper (e.g. RFC 2697's committed-rate bucket): tokens accrue at ``rate``
    per second up to ``burst``; each admission takes one.

    Args:
        rate: Tokens added per second (> 0).
        burst: Most tokens held (>= 1); the bucket starts full.
        clock: Monotonic seconds (tests pass a fake).
    """

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> bool:
        """Takes one token if there is one; returns whether it did."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


class _PrivateRotatingFile(logging.handlers.RotatingFileHandler):
    """A :class:`~logging.handlers.RotatingFileHandler` whose files are mode 0600 and
    whose write errors are logged once per error (never a traceback on stderr)."""

    def _open(self) -> io.TextIOWrapper:
        fd = os.open(
            self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        try:
            os.fchmod(fd, 0o600)  # one left by an older version or another umask
        except OSError:
            os.close(fd)
            raise
        return open(fd, "a", encoding="utf-8")  # the handler closes it

    def handleError(self, record: logging.LogRecord) -> None:
        log.exception("audit log %s: cannot write a record", self.baseFilename)


class AuditLog:
    """Appends audit records to a JSON-lines file that rotates by size.

    Args:
        path: The file; rotated files are ``PATH.1`` ... ``PATH.N`` beside it. Its
            directory must exist.
        max_bytes: Rotate before the file passes this size, bytes (>= 1024).
        backups: Rotated files kept (>= 1).
        refusals_per_s: Average rate of refusal records written (> 0).
        burst: Refusal records written at once before the rate applies (>= 1).
        clock: Monotonic seconds for the rate limit (tests pass a fake).

    Raises:
        ValueError: A limit is out of range.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backups: int = DEFAULT_BACKUPS,
        refusals_per_s: float = DEFAULT_REFUSALS_PER_S,
        burst: int = DEFAULT_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_bytes < 1024 or backups < 1:
            raise ValueError(
                f"audit log limits out of range: max_bytes {max_bytes} (>= 1024), "
                f"backups {backups} (>= 1)"
            )
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self._clock = clock
        self._bucket = TokenBucket(refusals_per_s, burst, clock)
        self._lock = threading.Lock()
        self._suppressed: dict[str, int] = {}
        self._suppressed_since = ""
        self._summary_at = clock()
        self._handler = _PrivateRotatingFile(
            self.path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=True
        )

    @property
    def cap_bytes(self) -> int:
        """Most bytes the trail takes: every file at its limit (one record over, each)."""
        return self.max_bytes * (self.backups + 1)

    def record(self, *, who: str, what: str, outcome: str, **details: object) -> None:
        """Writes one record (never dropped); errors are logged, never raised.

        Args:
            who: The actor: a client address, a user, ``daemon``.
            what: The action, e.g. ``POST /v1/pins`` or a command line.
            outcome: ``ok``, a status code, or why it was refused.
            **details: More fields; strings are cut to :data:`FIELD_CHARS`.
        """
        with self._lock:
            self._summarize(force=False)
            self._write(who, what, outcome, details)

    def refused(self, *, who: str, what: str, outcome: str, **details: object) -> None:
        """Writes a refusal (a bad token, an oversize request) unless refusals are coming
        faster than the rate limit; those are counted and summarized instead.

        Args: as :meth:`record`.
        """
        with self._lock:
            if not self._bucket.take():
                if not self._suppressed:
                    self._suppressed_since = _now()
                key = outcome if len(self._suppressed) < MAX_OUTCOMES else "other"
                key = key if key in self._suppressed or len(key) <= 64 else truncate(key, 64)
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                self._summarize(force=False)
                return
            self._summarize(force=False)
            self._write(who, what, outcome, details)

    def suppressed(self) -> int:
        """Refusals counted but not written since the last summary."""
        with self._lock:
            return sum(self._suppressed.values())

    def close(self) -> None:
        """Writes the pending summary, if any, and closes the file."""
        with self._lock:
            self._summarize(force=True)
            self._handler.close()

    def _summarize(self, force: bool) -> None:
        if not self._suppressed:
            return
        now = self._clock()
        if not force and now - self._summary_at < SUMMARY_S:
            return
        counts, self._suppressed = self._suppressed, {}
        self._summary_at = now
        self._write(
            "audit",
            "rate limit",
            "suppressed",
            {
                "suppressed": sum(counts.values()),
                "since": self._suppressed_since,
                "by_outcome": counts,
            },
        )

    def _write(self, who: str, what: str, outcome: str, details: dict[str, object]) -> None:
        entry: dict[str, object] = {
            "ts": _now(),
            "who": truncate(who),
            "what": truncate(what),
            "outcome": truncate(outcome),
        }
        for key, value in details.items():
            if key == "by_outcome":
                entry[key] = value  # our own summary, already bounded
            else:
                entry[truncate(key, 64)] = _bounded(value)
        line = json.dumps(entry, default=str, separators=(",", ":"))
        self._handler.handle(logging.makeLogRecord({"msg": line, "args": None}))


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
