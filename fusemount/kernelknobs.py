"""The kernel's knobs of this process's FUSE connection, set once the session runs: the
backing device's readahead window and the connection's background request queue.

``mountpoint`` must already be absolute and resolved: resolving it would stat the mount,
and this process must never touch its own mountpoint (it would wait on itself).
"""

from __future__ import annotations

import logging
from pathlib import Path

import trio

from spoke.disk.mountinfo import mounts

log = logging.getLogger("fusemount")

MAX_BACKGROUND = 256
"""FUSE requests the kernel keeps outstanding to the mount without a caller waiting in
them (readahead and other asynchronous reads), for every reader of the node together
(``/sys/fs/fuse/connections/N/max_background``, the kernel's
``Documentation/filesystems/fuse.rst``). The kernel's default is 12, and it queues the
rest in arrival order: issue 39's nineteenth probe saw one team's 16 readers keep
another team's misses of 256 KiB files at p50 0.31 s behind theirs (66 ms with 64), and
the twentieth 64 readers at p50 / p90 0.18 / 0.73 s with 64 (0.16 / 0.23 s with 256).
As many as the mount serves at once (``pyfuse3.main``'s ``max_tasks``, :data:`TASKS`)."""

TASKS = MAX_BACKGROUND
"""Most FUSE requests the mount serves at once (pyfuse3's ``max_tasks``)."""


def mount_device(mountpoint: Path) -> str | None:
    """The ``major:minor`` of the mount at ``mountpoint``, read from /proc/self/mountinfo."""
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


def set_max_background(mountpoint: Path, requests: int = MAX_BACKGROUND) -> bool:
    """Set how many background requests the kernel keeps outstanding to the mount at
    ``mountpoint`` (:data:`MAX_BACKGROUND`), and its congestion threshold (three quarters
    of it, the kernel's own ratio: past it the page cache holds back readahead), through the
    FUSE control file system (``/sys/fs/fuse/connections/<minor>/``: root only).

    Returns:
        True when set; False (logged) when the mount, the control file system or the
        permission is missing.
    """
    device = mount_device(mountpoint)
    if device is None:
        log.warning("max_background: %s not found in mountinfo", mountpoint)
        return False
    folder = Path("/sys/fs/fuse/connections") / device.split(":")[1]
    try:
        (folder / "max_background").write_text(f"{requests}\n")
        (folder / "congestion_threshold").write_text(f"{requests * 3 // 4}\n")
    except OSError as err:
        log.warning("max_background of %s (connection %s) not set: %s", mountpoint, device, err)
        return False
    log.info("max_background of %s (connection %s) = %d", mountpoint, device, requests)
    return True


async def tune_connection(mountpoint: Path, read_ahead_kb: int = 0) -> None:
    """Set the connection's background queue and (``read_ahead_kb`` > 0) readahead window.

    The kernel takes both from FUSE's INIT reply when it processes it, so they are set
    once the session is running, not right after mounting.
    """
    await trio.sleep(0.3)
    await trio.to_thread.run_sync(set_max_background, mountpoint)
    if read_ahead_kb > 0:
        await trio.to_thread.run_sync(set_read_ahead, mountpoint, read_ahead_kb)
