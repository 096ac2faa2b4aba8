"""What the daemon may hold open for others: its open-file limit, the caps on connections
to its admin API and peer port fitted under that limit.

- **Open files.** The daemon raises its soft ``RLIMIT_NOFILE`` to the hard limit at start
  (as the mount does; systemd's default soft limit is 1024), then fits the caps under it:
  the admin API at most :data:`ADMIN_MAX_CONNECTIONS` and an eighth of the limit, the
  peer port at most ``--peer-max-connections`` and a sixteenth of it (each connection
  takes seven descriptors: the caller's socket, the door's relay socket and gRPC's end of
  it, two pipes; :mod:`strata_local.door`), leaving the rest to block
  files, the index, the hub and the mount. A cap lowered to fit is logged once at start.
  Connections beyond a cap are closed as they arrive, so the daemon never runs out of
  descriptors to a flood of idle connections (reads of cold blocks then stalled, and
  asyncio logged its accept failure hundreds of thousands of times a minute).
- **Malloc arenas.** The daemon limits glibc's malloc arenas before gRPC starts its
  threads (:func:`strata_local.memory.limit_malloc_arenas`), so floods of connections
  level off after the first instead of leaving it larger each time.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

log = logging.getLogger(__name__)

ADMIN_MAX_CONNECTIONS = 256
"""Most connections open to the admin API at once (operators, Prometheus, probes, the
training jobs' hint posts need a few each)."""

PEER_FILES = 16
"""The peer port's cap is at most the open-file limit over this (a connection through the
door holds seven descriptors; the rest stay for block files, the index, the hub)."""


def raise_open_files() -> int:
    """Raise this process's soft open-file limit to its hard limit.

    Returns:
        The soft limit now (unchanged where it cannot be raised).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as err:
            log.debug("cannot raise the open-file limit to %s: %s", target, err)
    return int(soft)


@dataclass(frozen=True)
class ConnectionCaps:
    """Connection caps that fit the open-file limit.

    Attributes:
        admin: Most admin API connections open at once.
        peer: Most peer port connections open at once.
    """

    admin: int
    peer: int

    @classmethod
    def fit(cls, open_files: int, peer: int, admin: int = ADMIN_MAX_CONNECTIONS) -> ConnectionCaps:
        """The caps asked for, lowered (with a warning) to fit ``open_files``.

        Args:
            open_files: The soft open-file limit.
            peer: The peer port cap asked for (``--peer-max-connections``; 0: no peer port).
            admin: The admin API cap asked for.
        """
        fitted = cls(
            admin=max(8, min(admin, open_files // 8)),
            peer=max(8, min(peer, open_files // PEER_FILES)) if peer else 0,
        )
        if fitted.peer < peer:
            log.warning(
                "open-file limit %d: at most %d peer port connections (asked for %d); raise "
                "the limit (LimitNOFILE, ulimit -n) for more",
                open_files,
                fitted.peer,
                peer,
            )
        return fitted
