"""Where a spoke's cache lives on disk: the paths shared by the daemon and the mount.

This is the read side shared by the daemon and the mount process (the mount reads cache
hits straight from block files, with no daemon round trip)::

    CACHE_DIR/
      blocks/<d[0:2]>/<digest>     one file per cached block, named by its xxh3-128 digest
      blocks/<d[0:2]>/.tmp-*       a block being written (renamed into place when complete)
      index/                       LMDB index, written only by the daemon
      daemon.sock                  the daemon's local gRPC socket (SpokeLocal), peer-checked
      .grpc/sock                   where gRPC itself listens, in a private (0700) directory
      .grpc/{daemon,mount}-*.json  the settings the supervisor hands each child (0600)
      .grpc/heir                   where the running supervisor hears a successor (0600)
      admin.url                    the admin API's base URL, written once it listens
      daemon.pid, mount.pid        process ids of the running daemon and mount
      mount-restarts               remounts of a mount that died, counted by supervisors

A block file is only ever visible complete: the daemon writes it under a temporary name
and renames it into place (rename(2) is atomic within one filesystem).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import xxhash

DIGEST_RE = re.compile(r"^[0-9a-f]{32}$")
TMP_PREFIX = ".tmp-"


def block_digest(data: bytes | bytearray | memoryview) -> str:
    """The block id of ``data``: xxh3-128 as 32 lowercase hex characters (xxHash spec, XXH3)."""
    return xxhash.xxh3_128_hexdigest(data)


def is_digest(value: str) -> bool:
    """True when ``value`` is a well-formed block digest (32 lowercase hex characters)."""
    return bool(DIGEST_RE.match(value))


@dataclass(frozen=True)
class CacheLayout:
    """Paths inside one spoke cache directory.

    Args:
        root: the cache directory (``--cache-dir``).
    """

    root: Path

    @property
    def blocks_dir(self) -> Path:
        """Directory of block files."""
        return self.root / "blocks"

    @property
    def index_dir(self) -> Path:
        """LMDB environment directory of the block index and cached catalog."""
        return self.root / "index"

    @property
    def socket_path(self) -> Path:
        """UNIX socket of the daemon's local gRPC service."""
        return self.root / "daemon.sock"

    @property
    def private_dir(self) -> Path:
        """Owner-only (0700) directory of the gRPC server's own socket and the children's
        settings files (:func:`spoke.disk.hardening.private_socket_dir`)."""
        return self.root / ".grpc"

    @property
    def grpc_socket_path(self) -> Path:
        """UNIX socket gRPC listens on; only ``daemon.sock``'s peer check splices to it."""
        return self.private_dir / "sock"

    @property
    def succession_socket(self) -> Path:
        """UNIX socket (0600, in the private directory) on which the running ``strata-spoke
        run`` hears a new one that takes it over (:mod:`spoke.run.succession`); its path is
        no longer than ``daemon.sock``'s, so the cache dir's length check covers it."""
        return self.private_dir / "heir"

    @property
    def successions_file(self) -> Path:
        """How many times a new spoke took over this cache dir's connection (a counter)."""
        return self.root / "successions"

    @property
    def daemon_pid_file(self) -> Path:
        """Process id of the running daemon."""
        return self.root / "daemon.pid"

    @property
    def mount_pid_file(self) -> Path:
        """Process id of the running mount."""
        return self.root / "mount.pid"

    @property
    def mount_restarts_file(self) -> Path:
        """How many times a supervisor remounted a mount that died (a counter)."""
        return self.root / "mount-restarts"

    @property
    def mount_handovers_file(self) -> Path:
        """How many times a new mount process resumed the connection of one that ended."""
        return self.root / "mount-handovers"

    @property
    def spoke_lock(self) -> Path:
        """Lock held by the running ``strata-spoke run`` (see :mod:`spoke.run.lock`)."""
        return self.root / "spoke.lock"

    @property
    def daemon_lock(self) -> Path:
        """Lock held by the running daemon (see :mod:`spoke.run.lock`)."""
        return self.root / "daemon.lock"

    @property
    def admin_url_file(self) -> Path:
        """File holding the admin API's base URL once it listens."""
        return self.root / "admin.url"

    def block_path(self, digest: str) -> Path:
        """Path of the block file for ``digest``.

        Raises:
            ValueError: ``digest`` is not 32 lowercase hex characters (never a path outside).
        """
        if not is_digest(digest):
            raise ValueError(f"malformed block digest {digest!r}")
        return self.blocks_dir / digest[:2] / digest
