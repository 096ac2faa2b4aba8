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

**Grace** (``grace_s``, ``strata-hub gc --grace``; 7 days on the command line). A blob
found unreferenced is not deleted then: it becomes a *candidate*, recorded with the time
it was first found so in a note kept beside the blobs (:data:`CANDIDATES`, in the blob
store, not the catalog: it must outlive a catalog that is restored from a backup), and is
deleted by a later collection only once it has been unreferenced for the whole grace
period, checked again inside the deleting transaction. A candidate found referenced again
— by a new publish, or by a catalog restored from a backup taken before its version was
revoked — leaves the list. So a catalog backup no older than the grace period can be
restored without losing a blob it references, whatever ``gc`` ran in between (the restore
drill, ``tests/integration/test_hub_restore.py``). With ``grace_s`` 0 the unreferenced
blobs go at once, as before.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from hub.catalog import Catalog
from hub.errors import StorageError
from hub.store.blobstore import BlobStore

STALE_AFTER_SECONDS = 24 * 3600.0
"""A publish older than this is considered abandoned even on another host, seconds."""

TEMP_MAX_AGE_SECONDS = 3600.0
"""Interrupted blob writes older than this are removed, seconds."""

PAGE_DIGESTS = 1000
"""Digests checked and deleted per catalog write transaction."""

GRACE_SECONDS = 7 * 24 * 3600.0
"""``strata-hub gc --grace`` by default: a catalog backup up to a week old stays restorable."""

CANDIDATES = "gc-candidates"
"""The note (:meth:`hub.store.blobstore.BlobStore.read_note`) of unreferenced blobs waiting out
the grace: one record per blob, its raw 16-byte digest and the ns it was first found
unreferenced (:data:`_CANDIDATE`)."""

_CANDIDATE = struct.Struct(">16sq")


@dataclass(frozen=True, slots=True)
class GcResult:
    """What a collection did (or, with ``dry_run``, would do).

    Attributes:
        blobs_scanned: Blobs listed in the store.
        blobs_deleted: Blobs deleted (or found deletable) as garbage.
        publishes_dropped: Abandoned publishes removed.
        temp_removed: Leftovers of interrupted writes removed.
        events_pruned: Catalog events pruned.
        blobs_waiting: Unreferenced blobs kept for the rest of their grace.
    """

    blobs_scanned: int
    blobs_deleted: int
    publishes_dropped: int
    temp_removed: int
    events_pruned: int
    blobs_waiting: int = 0


def load_candidates(store: BlobStore) -> dict[str, int]:
    """The candidates note: digest -> ns first found unreferenced (empty when absent).

    Raises:
        StorageError: the note cannot be read, or is not a whole number of records.
    """
    raw = store.read_note(CANDIDATES) or b""
    if len(raw) % _CANDIDATE.size:
        raise StorageError(f"{CANDIDATES} in {store.location} is cut short ({len(raw)} bytes)")
    return {d.hex(): ns for d, ns in _CANDIDATE.iter_unpack(raw)}


def _save_candidates(store: BlobStore, candidates: dict[str, int]) -> None:
    store.write_note(
        CANDIDATES, b"".join(_CANDIDATE.pack(bytes.fromhex(d), ns) for d, ns in candidates.items())
    )


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
    grace_s: float = 0.0,
    now_ns: Callable[[], int] = time.time_ns,
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
        grace_s: How long a blob must have been found unreferenced before it is deleted,
            seconds (0: at once); see the module docstring.
        now_ns: The wall clock, ns since the epoch (for tests).

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

    candidates = load_candidates(store) if grace_s > 0 else {}
    found = now_ns()
    due_before = found - int(grace_s * 1e9)
    waiting: dict[str, int] = {}  # the candidates after this collection

    gone: list[str] = []

    def sweep(garbage: list[str]) -> None:
        """Inside the catalog's write transaction (the page's unreferenced blobs): delete
        those that waited out their grace, keep the others waiting."""
        due = [d for d in garbage if candidates.get(d, found) <= due_before]
        if due and not dry_run:
            store.delete(due)
        gone.extend(due)
        kept = set(garbage).difference(due)
        waiting.update((d, candidates.get(d, found)) for d in kept)

    scanned = 0
    digests = store.iter_digests()
    while page := list(itertools.islice(digests, PAGE_DIGESTS)):
        scanned += len(page)
        catalog.delete_unreferenced(page, sweep)
    deleted = len(gone)
    if grace_s > 0 and not dry_run:
        _save_candidates(store, waiting)  # referenced again, or deleted: left out
    pruned = 0
    if keep_events is not None and not dry_run:
        pruned = catalog.prune_events(keep_events)
    return GcResult(scanned, deleted, dropped, temp, pruned, len(waiting))
