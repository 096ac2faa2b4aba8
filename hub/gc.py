"""Garbage collection: deleting blobs no live version references, safely under publishes.

A blob is garbage when no live (unrevoked) version's manifest names it and no publish in
flight has protected it (:class:`hub.catalog.PublishSession`). Collection runs alongside
publishes and serving:

1. publishes abandoned by a crashed process are dropped (their staged manifest and their
   protections): a publish recorded on this host whose process is gone, or any publish
   older than ``stale_after_s``;
2. leftovers of interrupted blob writes older than an hour are removed;
3. the blob store is listed, and each page of digests is checked *and deleted* inside one
   catalog write transaction (:meth:`hub.catalog.Catalog.delete_unreferenced`). LMDB
   admits one writer at a time, and a publish protects a digest in a write transaction
   before it stores (or relies on an existing copy of) the block, so either the
   protection commits first and the check keeps the blob, or the deletion happens first
   and the publish then finds the blob missing and stores it again. No live block is
   lost (the mark-and-sweep race described for Git's ``gc.pruneExpire`` cannot happen);
4. optionally, old catalog events are pruned.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from hub.blobstore import BlobStore
from hub.catalog import Catalog

STALE_AFTER_SECONDS = 24 * 3600.0
"""A publish older than this is considered abandoned even on another host, seconds."""

TEMP_MAX_AGE_SECONDS = 3600.0
"""Interrupted blob writes older than this are removed, seconds."""

PAGE_DIGESTS = 1000
"""Digests checked and deleted per catalog write transaction."""


@dataclass(frozen=True, slots=True)
class GcResult:
    """What a collection did (or, with ``dry_run``, would do).

    Attributes:
        blobs_scanned: Blobs listed in the store.
        blobs_deleted: Blobs deleted (or found deletable) as garbage.
        publishes_dropped: Abandoned publishes removed.
        temp_removed: Leftovers of interrupted writes removed.
        events_pruned: Catalog events pruned.
    """

    blobs_scanned: int
    blobs_deleted: int
    publishes_dropped: int
    temp_removed: int
    events_pruned: int


def pid_alive(pid: int) -> bool:
    """Tells whether a process with id ``pid`` exists on this host (signal 0 probe)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def collect(
    catalog: Catalog,
    store: BlobStore,
    *,
    dry_run: bool = False,
    stale_after_s: float = STALE_AFTER_SECONDS,
    keep_events: int | None = None,
    is_alive: Callable[[int], bool] = pid_alive,
) -> GcResult:
    """Deletes garbage blobs and abandoned publishes; see the module docstring.

    Args:
        catalog: The data directory's catalog.
        store: Its blob store.
        dry_run: Only count what would be deleted.
        stale_after_s: Age after which any publish in progress counts as abandoned,
            seconds.
        keep_events: Prune all but this many newest events; None keeps them all.
        is_alive: Tells whether a process of this host is running (for tests).

    Returns:
        What was done.

    Raises:
        StorageError: The blob store cannot be listed or refuses a deletion.
        CatalogError: The catalog cannot be written.
    """
    host = socket.gethostname()
    now = time.time_ns()
    dropped = 0
    for record in catalog.list_publishes():
        crashed = record.host == host and not is_alive(record.pid)
        stale = now - record.started_ns > stale_after_s * 1e9
        if (crashed or stale) and (dry_run or catalog.drop_publish(record.publish_id)):
            dropped += 1
    temp = 0 if dry_run else store.clean_temp(TEMP_MAX_AGE_SECONDS)

    def delete(digests: list[str]) -> None:
        if not dry_run:
            store.delete(digests)

    scanned = deleted = 0
    digests = store.iter_digests()
    while page := list(itertools.islice(digests, PAGE_DIGESTS)):
        scanned += len(page)
        deleted += len(catalog.delete_unreferenced(page, delete))
    pruned = 0
    if keep_events is not None and not dry_run:
        pruned = catalog.prune_events(keep_events)
    return GcResult(scanned, deleted, dropped, temp, pruned)
