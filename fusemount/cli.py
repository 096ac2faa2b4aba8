"""``strata-mount``: run the read-only mount in the foreground (``strata-spoke run`` starts it).

strata-mount --cache-dir DIR [--socket PATH] [--miss-deadline S] [--allow-other]
             [--encryption-key-file KEY] [--passthrough auto|off] MOUNTPOINT
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import signal
import sys
from pathlib import Path

import pyfuse3
import trio

from fusemount.client import DaemonClient
from fusemount.operations import StrataOperations
from fusemount.passthrough import Passthrough, unavailable_reason
from fusemount.reader import BlockReader
from spoke.disk.encryption import BlockCipher, EncryptionError, check_cache_key
from spoke.disk.hardening import UnsafeDirectory, secure_cache_dir
from spoke.disk.layout import CacheLayout
from spoke.disk.mountinfo import mounts

log = logging.getLogger("fusemount")


def mount_device(mountpoint: Path) -> str | None:
    """The ``major:minor`` of the mount at ``mountpoint``, read from /proc/self/mountinfo.

    ``mountpoint`` must already be absolute and resolved: resolving it now would stat the
    mount, and this process must never touch its own mountpoint (it would wait on itself).
    """
    target = str(mountpoint)
    on_top = [m.device for m in mounts() if m.mountpoint == target]
    return on_top[-1] if on_top else None  # the last match is the mount on top


def set_read_ahead(mountpoint: Path, kib: int) -> bool:
    """Set the kernel readahead window of the mount's backing device, KiB.

    FUSE mounts get a small default window; sequential reads of large files go much faster
    with ~1 MiB (``/sys/class/bdi/<major:minor>/read_ahead_kb``, Linux ``Documentation/ABI``).

    Returns:
        True when set; False (logged) when the device or permission is missing.
    """
    device = mount_device(mountpoint)
    if device is None:
        log.warning("read_ahead_kb: %s not found in mountinfo", mountpoint)
        return False
    try:
        Path(f"/sys/class/bdi/{device}/read_ahead_kb").write_text(f"{kib}\n")
    except OSError as err:
        log.warning("read_ahead_kb of %s (%s) not set: %s", mountpoint, device, err)
        return False
    log.info("read_ahead_kb of %s (bdi %s) = %d", mountpoint, device, kib)
    return True


OPEN_FILES_WANTED = 4096
"""Open files the mount wants: its table of open block files (1024), FUSE, sockets."""


def raise_open_file_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit.

    systemd and many container runtimes start services with a soft limit of 1024, which
    the mount's table of open block files alone reaches: every block file opened past it
    failed with EMFILE, i.e. EIO for the reader (getrlimit(2)).

    Returns:
        The soft limit now.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 1 << 20 if hard == resource.RLIM_INFINITY else hard  # fs.nr_open's default
    if soft != resource.RLIM_INFINITY and target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as err:
            log.warning("could not raise the open file limit from %d: %s", soft, err)
    if soft != resource.RLIM_INFINITY and soft < OPEN_FILES_WANTED:
        log.warning(
            "open file limit is %d (hard limit); the mount wants %d: raise LimitNOFILE",
            soft,
            OPEN_FILES_WANTED,
        )
    return soft


def mount_options(allow_other: bool = False) -> set[str]:
    """FUSE mount options: read-only, named ``strata``, kernel permission checks."""
    options = set(pyfuse3.default_options) | {"fsname=strata", "subtype=strata", "ro"}
    if allow_other:
        options.add("allow_other")
    return options


async def _stop_on_signal() -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("signal %d: unmounting", signum)
            pyfuse3.terminate()
            return


async def _raise_read_ahead(mountpoint: Path, kib: int) -> None:
    # The kernel clamps the window to what FUSE's INIT reply allows when that reply is
    # processed, so set it once the session is running, not right after mounting.
    await trio.sleep(0.3)
    await trio.to_thread.run_sync(set_read_ahead, mountpoint, kib)


async def serve(
    ops: StrataOperations, reader: BlockReader, mountpoint: Path, read_ahead_kb: int = 0
) -> None:
    """Serve FUSE requests until unmounted or signalled, flushing access records."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ops.watch_catalog)
        if read_ahead_kb > 0:
            nursery.start_soon(_raise_read_ahead, mountpoint, read_ahead_kb)
        nursery.start_soon(reader.flush_hits_forever)
        nursery.start_soon(reader.prefetch_forever)
        nursery.start_soon(_stop_on_signal)
        await pyfuse3.main(min_tasks=4, max_tasks=64)
        nursery.cancel_scope.cancel()
    await reader.flush_hits()


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for bad input)."""
    parser = argparse.ArgumentParser(
        prog="strata-mount",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument(
        "--socket", type=Path, default=None, help="daemon socket (default CACHE_DIR/daemon.sock)"
    )
    parser.add_argument("--miss-deadline", type=float, default=60.0)
    parser.add_argument(
        "--allow-other",
        action="store_true",
        help="let other users read the mount (kernel checks the file modes)",
    )
    parser.add_argument(
        "--read-ahead-kb",
        type=int,
        default=1024,
        help="kernel readahead window of the mount, KiB (0 leaves it)",
    )
    parser.add_argument(
        "--encryption-key-file",
        type=Path,
        default=None,
        help="key of block files encrypted at rest (the daemon's --encryption-key-file)",
    )
    parser.add_argument(
        "--passthrough",
        choices=("auto", "off"),
        default="auto",
        help="let the kernel read cached one-block files itself (FUSE passthrough) where "
        "the kernel, libfuse and privileges allow it (auto), or never (off)",
    )
    parser.add_argument(
        "--log-level", default="INFO", type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR")
    )
    ns = parser.parse_args(argv)
    logging.basicConfig(
        level=ns.log_level.upper(),
        format="%(asctime)s strata-mount %(levelname)s %(name)s: %(message)s",
    )
    raise_open_file_limit()
    mountpoint: Path = ns.mountpoint.resolve()  # before mounting: never stat it afterwards
    if not mountpoint.is_dir():
        print(f"strata-mount: error: mountpoint {mountpoint} is not a directory", file=sys.stderr)
        return 2
    layout = CacheLayout(ns.cache_dir)
    try:  # before anything is read there: refuse a directory another user could change
        secure_cache_dir(layout)
    except UnsafeDirectory as err:
        print(f"strata-mount: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"strata-mount: error: cache dir {layout.root}: {err.strerror}", file=sys.stderr)
        return 2
    try:
        cipher = BlockCipher.from_file(ns.encryption_key_file) if ns.encryption_key_file else None
        check_cache_key(layout, cipher, ns.encryption_key_file, record=False)
    except EncryptionError as err:
        print(f"strata-mount: error: {err}", file=sys.stderr)
        return 2
    client = DaemonClient(ns.socket or layout.socket_path, miss_deadline=ns.miss_deadline)
    reader = BlockReader(layout, client, cipher=cipher)
    encrypted = bool(getattr(reader.files, "encrypted", False))
    passthrough = Passthrough(unavailable_reason(ns.passthrough, ns.cache_dir, encrypted))
    ops = StrataOperations(client, reader, passthrough)
    # written first: whoever sees the mount appear (libfuse 3.17 makes it visible before
    # init returns) finds the pid of the process serving it
    layout.mount_pid_file.write_text(f"{os.getpid()}\n")
    try:
        pyfuse3.init(ops, str(mountpoint), mount_options(ns.allow_other))
    except RuntimeError as err:
        layout.mount_pid_file.unlink(missing_ok=True)
        print(f"strata-mount: error: cannot mount {mountpoint}: {err}", file=sys.stderr)
        return 2
    log.info("mounted %s", mountpoint)
    try:
        trio.run(serve, ops, reader, mountpoint, ns.read_ahead_kb)
    finally:
        pyfuse3.close(unmount=True)
        client.close()
        log.info("unmounted %s", mountpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
