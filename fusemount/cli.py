"""``strata-mount``: run the read-only mount in the foreground (``strata-spoke run`` starts it).

strata-mount --cache-dir DIR [--socket PATH] [--miss-deadline S] [--allow-other]
             [--encryption-key-file KEY] [--passthrough auto|off] MOUNTPOINT
strata-mount --settings FILE [--socket PATH] MOUNTPOINT

The options, their defaults and help are those of the spoke's settings
(spoke.run.schema.MountSettings); ``strata-spoke run`` hands them over as a file.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import resource
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import pyfuse3
import trio
from pydantic import ValidationError

from fusemount.backings import ACTIVE_BACKINGS, IDLE_BACKINGS
from fusemount.client import DaemonClient
from fusemount.journal import InodeJournal
from fusemount.kernelknobs import TASKS, tune_connection
from fusemount.ledger import BackingLedger
from fusemount.lockcheck import warn_unless_granted
from fusemount.operations import StrataOperations
from fusemount.passthrough import Passthrough
from fusemount.passthroughcheck import unavailable_reason
from fusemount.reader import BlockReader
from fusemount.tree import InodeTable
from spoke.disk import handover
from spoke.disk.datasetgroups import DatasetGroups
from spoke.disk.encryption import EncryptionError, check_cache_key
from spoke.disk.hardening import UnsafeDirectory, secure_cache_dir
from spoke.disk.layout import CacheLayout
from spoke.run.schema import MountSettings, declared, read_settings

log = logging.getLogger("fusemount")


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


def _descriptors(open_files: int, most: int, part: int) -> int:
    """``most``, or a ``part``-th of a soft open-file limit of ``open_files`` (-1:
    unlimited) where that is less."""
    if open_files == resource.RLIM_INFINITY:
        return most
    return max(0, min(most, open_files // part))


def idle_backings(open_files: int) -> int:
    """Idle passthrough backing ids that keep their descriptor with a soft open-file limit
    of ``open_files`` (-1: unlimited): at most half the limit (a quarter more for active
    ones, :func:`active_backings`; the rest for the block-file table, 1,024, and sockets)."""
    return _descriptors(open_files, IDLE_BACKINGS, 2)


def active_backings(open_files: int) -> int:
    """Inodes with passthrough handles open at once with a soft open-file limit of
    ``open_files`` (-1: unlimited): each holds a descriptor, so at most a quarter of the
    limit (see :func:`idle_backings`)."""
    return _descriptors(open_files, ACTIVE_BACKINGS, 4)


def mount_options(allow_other: bool = False) -> set[str]:
    """FUSE mount options: read-only, named ``strata``, kernel permission checks."""
    options = set(pyfuse3.default_options) | {"fsname=strata", "subtype=strata", "ro"}
    if allow_other:
        options.add("allow_other")
    return options


class _Exit:
    """How the serving loop ended: SIGUSR2 asks to hand the connection over (stop
    reading it, exit without unmounting: the supervisor's successor resumes it)."""

    handing_over = False


async def _stop_on_signal(exit_: _Exit) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGUSR2) as signals:
        async for signum in signals:
            exit_.handing_over = signum == signal.SIGUSR2
            log.info(
                "signal %d: %s", signum, "handing over" if exit_.handing_over else "unmounting"
            )
            pyfuse3.terminate()
            return


async def _every_second(call: Callable[[], None]) -> None:
    while True:
        await trio.sleep(1)
        call()


async def serve(
    ops: StrataOperations,
    reader: BlockReader,
    mountpoint: Path,
    read_ahead_kb: int = 0,
    exit_: _Exit | None = None,
    check: Callable[[], None] | None = None,
) -> None:
    """Serve FUSE requests until unmounted or signalled, flushing access records
    (``check``: called every second, the hand-over records' health)."""
    async with trio.open_nursery() as nursery:
        if check is not None:
            nursery.start_soon(_every_second, check)
        nursery.start_soon(ops.watch_catalog)
        nursery.start_soon(ops.passthrough.sweep_forever)
        nursery.start_soon(tune_connection, mountpoint, read_ahead_kb)
        nursery.start_soon(reader.flush_hits_forever)
        nursery.start_soon(reader.prefetch_forever)
        nursery.start_soon(_stop_on_signal, exit_ or _Exit())
        await pyfuse3.main(min_tasks=4, max_tasks=TASKS)
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
        shown = f" (default {option.default})" if option.default not in (None, False, ()) else ""
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
    warn_unless_granted()  # a pyfuse3 without the lock handlers: one reader can block others
    # resuming, the mount is served by no one until we do: never stat it (the supervisor
    # resolved it); mounting, resolve it first and never stat it afterwards
    resuming = handover.RESUME_ENV in os.environ
    mountpoint: Path = ns.mountpoint if resuming else ns.mountpoint.resolve()
    if not resuming and not mountpoint.is_dir():
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
    try:
        session = _Session.from_environment(layout, settings.mount_handover)
    except (OSError, ValueError) as err:
        print(f"strata-mount: error: cannot resume the FUSE connection: {err}", file=sys.stderr)
        return 2
    passthrough = Passthrough(
        unavailable_reason(settings.passthrough, settings.cache_dir, encrypted),
        idle_max=idle_backings(open_files),
        ledger=session.ledger,
        block_path=layout.block_path,
        exclusive=session.workers <= 1,
        snapshot_of=session.inodes.snapshot_of,
        active_max=active_backings(open_files),
    )
    if session.workers > 1:  # forgets of our lookups may go to another worker
        session.inodes.resumed = True
        if session.inodes.journal is not None:
            session.inodes.journal.shared = True
        if session.ledger is not None:
            session.ledger.shared = True
    ops = StrataOperations(
        client,
        reader,
        passthrough,
        session.inodes,
        readable_by_all=settings.readable_by_all,
        uid=settings.mount_uid,
        gid=settings.mount_gid,
        dataset_groups=DatasetGroups(settings.dataset_groups),
    )
    # written first: whoever sees the mount appear (libfuse 3.17 makes it visible before
    # init returns) finds the pid of the process serving it; the first worker's only
    if session.worker == 0:
        layout.mount_pid_file.write_text(f"{os.getpid()}\n")
    try:
        session.start(ops, mountpoint, mount_options(settings.allow_other))
    except (RuntimeError, ValueError, OSError) as err:
        layout.mount_pid_file.unlink(missing_ok=True)
        print(f"strata-mount: error: cannot mount {mountpoint}: {err}", file=sys.stderr)
        return 2
    exit_ = _Exit()
    try:
        trio.run(
            serve, ops, reader, mountpoint, settings.read_ahead_kb, exit_, session.check_records
        )
    finally:
        # a resumed session has nothing to unmount (its supervisor does), nor one handed on
        pyfuse3.close(unmount=session.fresh and not exit_.handing_over)
        client.close()
        log.info("%s %s", "handed over" if exit_.handing_over else "unmounted", mountpoint)
    return 0


class _Session:
    """How this process comes to serve the FUSE connection: a new mount, or the
    resumption of one a predecessor served (:mod:`spoke.disk.handover`), with the inode
    journal and backing ledger that make the hand-over exact."""

    def __init__(self, layout: CacheLayout, reason: str) -> None:
        self.reason = reason  # why no hand-over ("" = possible)
        self.control: socket.socket | None = None
        fd = os.environ.pop(handover.HANDOVER_ENV, None)
        if fd is not None:
            self.control = socket.socket(fileno=int(fd))
        resume = os.environ.pop(handover.RESUME_ENV, None)
        init = os.environ.pop(handover.INIT_ENV, None)
        self.resume_fd = int(resume) if resume is not None and not reason else None
        self.init_request = bytes.fromhex(init) if init else b""
        self.worker = int(os.environ.pop(handover.WORKER_ENV, "0"))
        self.workers = int(os.environ.pop(handover.WORKERS_ENV, "1"))
        self.fresh = self.resume_fd is None
        self.inodes = InodeTable()
        self.ledger: BackingLedger | None = None
        self.layout = layout
        self.unsafe = layout.private_dir / "fuse-handover-unsafe"  # a record was lost
        if reason:
            return
        journal = layout.private_dir / "fuse-inodes.jsonl"
        try:
            if self.fresh:
                self.unsafe.unlink(missing_ok=True)
            elif self.unsafe.exists():
                raise ValueError("the predecessor could not record every inode or backing id")
            self.inodes = InodeTable(InodeJournal(journal, self.fresh))
            if not self.fresh:
                assert self.inodes.journal is not None
                self.inodes.replay(self.inodes.journal.new_records())
            self.ledger = BackingLedger(layout.private_dir / "fuse-backings", self.fresh)
        except OSError as err:  # e.g. the cache disk is full
            if not self.fresh:
                raise
            self.reason = f"its records cannot be kept in {layout.private_dir}: {err.strerror}"
            self.inodes, self.ledger = InodeTable(), None

    def check_records(self) -> None:
        """Mark the connection not resumable once a journal or ledger write failed."""
        failed = (self.inodes.journal is not None and self.inodes.journal.failed) or (
            self.ledger is not None and self.ledger.failed
        )
        if failed and not self.unsafe.exists():
            log.error("mount hand-over off from now on: a record of this connection was lost")
            with contextlib.suppress(OSError):
                self.unsafe.touch()

    @classmethod
    def from_environment(cls, layout: CacheLayout, mode: str) -> _Session:
        """The session the supervisor's environment asks for (none of it: a new mount,
        handed over only when the supervisor gave a socket)."""
        reason = handover.unavailable_reason(mode)
        if not reason and handover.HANDOVER_ENV not in os.environ:
            reason = "no supervisor to hold the connection (strata-spoke run holds it)"
        return cls(layout, reason)

    def start(self, ops: StrataOperations, mountpoint: Path, options: set[str]) -> None:
        """Mount (or resume) and say which, and whether it can be handed over.

        Raises:
            RuntimeError, ValueError, OSError: the mount or the resumption failed.
        """
        if self.fresh:
            if self.control is not None and self.reason:
                with contextlib.suppress(OSError):  # its supervisor gone: nobody waits
                    handover.decline(self.control, self.reason)
            elif self.control is not None:
                ops.on_init.append(self._publish)
            pyfuse3.init(ops, str(mountpoint), options)
            log.info(
                "mounted %s; hand-over %s",
                mountpoint,
                f"off: {self.reason}" if self.reason else "on",
            )
            return
        pyfuse3.init(ops, f"/dev/fd/{self.resume_fd}", options)
        pyfuse3.resume(self.init_request)
        assert self.ledger is not None
        adopted = ops.passthrough.adopt(self.ledger.records())
        if self.control is not None:
            handover.announce_resumed(self.control)
        log.warning(
            "%s the FUSE connection of %s (%d inodes, %d backing ids taken over)",
            f"worker {self.worker} of {self.workers} resumed" if self.workers > 1 else "resumed",
            mountpoint, len(self.inodes), adopted,
        )  # fmt: skip

    def _publish(self) -> None:
        request = pyfuse3.init_request()
        if self.control is None or request is None:
            return
        try:
            handover.publish(self.control, pyfuse3.session_descriptor(), request)
        except OSError as err:
            log.warning(
                "hand-over off: the connection could not be given to the supervisor: %s", err
            )


if __name__ == "__main__":
    sys.exit(main())
