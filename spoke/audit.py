"""The spoke's audit trail: one JSON object per line, appended to ``CACHE_DIR/audit.jsonl``
(or ``--audit-log FILE``, which may be on another disk), mode 0600, rotated by size
(``--audit-max-bytes``, ``--audit-backups``: ``FILE.1`` ... ``FILE.N`` beside it, also
0600). :mod:`strata_local.audit` does the writing, shared with the hub.

Each record says when (``ts``, ISO 8601 UTC), who (``who``: the admin client's address, or
``daemon`` for the spoke's own actions such as retention and revocation purges), what
(``what``: the call, e.g. ``POST /v1/pins``, plus the names it was given) and the outcome
(``outcome``: the HTTP status, or why it was refused). Every string is cut to a few hundred
characters with its length noted. Refusals (a wrong token, a body too large, a refused
peer) go through :meth:`AuditLog.refused`, rate-limited with a summary of what was left
out; actions through :meth:`AuditLog.record`, never dropped. Tokens and other secrets are
never written. Lines are written whole with one ``write(2)`` in append mode, so concurrent
writers and a crash leave no torn records.
"""

from __future__ import annotations

from strata_local.audit import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES, AuditLog

__all__ = ["DEFAULT_BACKUPS", "DEFAULT_MAX_BYTES", "AuditLog"]
