"""``strata-mount``: run the read-only mount in the foreground (``strata-spoke run`` starts it).

strata-mount --cache-dir DIR [--socket PATH] [--miss-deadline S] [--allow-other]
             [--encryption-key-file KEY] [--passthrough auto|off] MOUNTPOINT
strata-mount --settings FILE [--socket PATH] MOUNTPOINT

The options, their defaults and help are those of the spoke's settings
(spoke.run.schema.MountSettings); ``strata-spoke run`` hands them over as a file.
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
from pydantic import ValidationError

from fusemount.client import DaemonClient
from fusemount.operations import StrataOperations
from fusemount.passthrough import IDLE_BACKINGS, Passthrough, unavailable_reason
from fusemount.reader import BlockReader
from spoke.disk.encryption import EncryptionError, check_cache_key
from spoke.disk.hardening import UnsafeDirectory, secure_cache_dir
from spoke.disk.layout import CacheLayout
from spoke.disk.mountinfo import mounts
from spoke.run.schema import MountSettings, declared, read_settings

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


def idle_backings(open_files: int) -> int:
    """Idle passthrough backing ids to keep with a soft open-file limit of ``open_files``
    (-1: unlimited): each holds a descriptor, so at most half the limit, the other half
    left to the block-file table (1024), open files and sockets."""
    if open_files == resource.RLIM_INFINITY:
        return IDLE_BACKINGS
    return max(0, min(IDLE_BACKINGS, open_files // 2))


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
        nursery.start_soon(ops.passthrough.sweep_forever)
        if read_ahead_kb > 0:
            nursery.start_soon(_raise_read_ahead, mountpoint, read_ahead_kb)
        nursery.start_soon(reader.flush_hits_forever)
        nursery.start_soon(reader.prefetch_forever)
        nursery.start_soon(_stop_on_signal)
        await pyfuse3.main(min_tasks=4, max_tasks=64)
        nursery.cancel_scope.cancel()
    await reader.flush_hits()


def _parser() -> argparse.ArgumentParser:
    """The mount's flags: those of :class:`MountSettings` (flag, help and default from the
    one schema), its own ``--socket``, and ``--settings`` (the file the supervisor writes)."""
    parser = argparse.ArgumentParser(
        prog="strata-mount",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument(
        "--settings",
        type=Path,
        default=None,
        help="the mount's settings as JSON (strata-spoke run writes it); no other settings",
    )
    parser.add_argument(
        "--socket", type=Path, default=None, help="daemon socket (default CACHE_DIR/daemon.sock)"
    )
    for option in declared(MountSettings):
        shown = f" (default {option.default})" if option.default not in (None, False) else ""
        if option.kind is bool:
            parser.add_argument(
                option.flag, dest=option.field, action="store_true", default=None,
                help=option.help,
            )  # fmt: skip
        else:
            parser.add_argument(
                option.flag, dest=option.field, type=option.kind, default=None,
                choices=option.choices or None, help=option.help + shown,
            )  # fmt: skip
    return parser


def _fail(message: str) -> int:
    print(f"strata-mount: error: {message}", file=sys.stderr)
    return 2


def _settings(ns: argparse.Namespace) -> MountSettings | str:
    """The mount's settings from ``--settings`` or from its flags; or why not, in one line."""
    given = {o.field: getattr(ns, o.field) for o in declared(MountSettings)}
    given = {k: v for k, v in given.items() if v is not None}
    try:
        if ns.settings is None:
            return MountSettings(**given)
        if given:
            return "--settings takes no other settings: " + " ".join(
                "--" + k.replace("_", "-") for k in given
            )
        return read_settings(MountSettings, ns.settings)
    except ValidationError as err:
        first = err.errors()[0]
        where = "--" + ".".join(str(p) for p in first["loc"]).replace("_", "-")
        if first["type"] == "missing":
            return f"{where} is required"
        message = str(first["msg"]).removeprefix("Value error, ")
        return message if message.startswith("--") else f"{where}: {message}"
    except OSError as err:
        return f"--settings {ns.settings}: {err.strerror or err}"


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for bad input)."""
    ns = _parser().parse_args(argv)
    settings = _settings(ns)
    if isinstance(settings, str):
        return _fail(settings)
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s strata-mount %(levelname)s %(name)s: %(message)s",
    )
    open_files = raise_open_file_limit()
    mountpoint: Path = ns.mountpoint.resolve()  # before mounting: never stat it afterwards
    if not mountpoint.is_dir():
        print(f"strata-mount: error: mountpoint {mountpoint} is not a directory", file=sys.stderr)
        return 2
    layout = CacheLayout(settings.cache_dir)
    try:  # before anything is read there: refuse a directory another user could change
        secure_cache_dir(layout)
    except UnsafeDirectory as err:
        print(f"strata-mount: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"strata-mount: error: cache dir {layout.root}: {err.strerror}", file=sys.stderr)
        return 2
    try:
        cipher = settings.block_cipher()
        check_cache_key(layout, cipher, settings.encryption_key_file, record=False)
    except EncryptionError as err:
        print(f"strata-mount: error: {err}", file=sys.stderr)
        return 2
    client = DaemonClient(ns.socket or layout.socket_path, miss_deadline=settings.miss_deadline)
    reader = BlockReader(layout, client, cipher=cipher)
    encrypted = bool(getattr(reader.files, "encrypted", False))
    passthrough = Passthrough(
        unavailable_reason(settings.passthrough, settings.cache_dir, encrypted),
        idle_max=idle_backings(open_files),
    )
    ops = StrataOperations(client, reader, passthrough)
    # written first: whoever sees the mount appear (libfuse 3.17 makes it visible before
    # init returns) finds the pid of the process serving it
    layout.mount_pid_file.write_text(f"{os.getpid()}\n")
    try:
        pyfuse3.init(ops, str(mountpoint), mount_options(settings.allow_other))
    except RuntimeError as err:
        layout.mount_pid_file.unlink(missing_ok=True)
        print(f"strata-mount: error: cannot mount {mountpoint}: {err}", file=sys.stderr)
        return 2
    log.info("mounted %s", mountpoint)
    try:
        trio.run(serve, ops, reader, mountpoint, settings.read_ahead_kb)
    finally:
        pyfuse3.close(unmount=True)
        client.close()
        log.info("unmounted %s", mountpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
