"""``strata-mount``: run the read-only mount in the foreground (``strata-spoke run`` starts it).

strata-mount --cache-dir DIR [--socket PATH] [--miss-deadline S] [--allow-other] MOUNTPOINT
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

import pyfuse3
import trio

from fusemount.client import DaemonClient
from fusemount.operations import StrataOperations
from fusemount.reader import BlockReader
from spoke.layout import CacheLayout

log = logging.getLogger("fusemount")


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


async def serve(reader: BlockReader) -> None:
    """Serve FUSE requests until unmounted or signalled, flushing access records."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader.flush_hits_forever)
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
    parser.add_argument("--allow-other", action="store_true")
    parser.add_argument("--log-level", default="INFO")
    ns = parser.parse_args(argv)
    logging.basicConfig(
        level=ns.log_level.upper(),
        format="%(asctime)s strata-mount %(levelname)s %(name)s: %(message)s",
    )
    mountpoint: Path = ns.mountpoint
    if not mountpoint.is_dir():
        print(f"strata-mount: error: mountpoint {mountpoint} is not a directory", file=sys.stderr)
        return 2
    layout = CacheLayout(ns.cache_dir)
    client = DaemonClient(ns.socket or layout.socket_path, miss_deadline=ns.miss_deadline)
    reader = BlockReader(layout, client)
    ops = StrataOperations(client, reader)
    try:
        pyfuse3.init(ops, str(mountpoint), mount_options(ns.allow_other))
    except RuntimeError as err:
        print(f"strata-mount: error: cannot mount {mountpoint}: {err}", file=sys.stderr)
        return 2
    layout.mount_pid_file.write_text(f"{os.getpid()}\n")
    log.info("mounted %s", mountpoint)
    try:
        trio.run(serve, reader)
    finally:
        pyfuse3.close(unmount=True)
        client.close()
        log.info("unmounted %s", mountpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
