"""The event log: reading events after a sequence number, and pruning old ones.

Events are appended in the transaction of the change they report
(:meth:`hub.catalog.txn.CatalogTxn.append_event`), under ``last_sequence + 1``
(:mod:`hub.catalog.events`).
"""

from __future__ import annotations

from hub.catalog.base import CatalogBase
from hub.catalog.events import Event, decode_event
from hub.catalog.schema import META_SEQUENCE, U64
from hub.errors import InvalidArgument


class EventsMixin(CatalogBase):
    """The event-log methods of :class:`~hub.catalog.Catalog`."""

    def last_sequence(self) -> int:
        """The sequence number of the newest event; 0 when there is none (cheap)."""
        with self.read() as txn:
            value = txn.get(META_SEQUENCE, db=self._db[b"meta"])
            return U64.unpack(value)[0] if value is not None else 0

    def first_sequence(self) -> int:
        """The oldest event still kept; ``last_sequence() + 1`` when none is kept."""
        with self.read() as txn:
            cursor = txn.cursor(db=self._db[b"events"])
            if cursor.first():
                first: int = U64.unpack(cursor.key())[0]
                return first
            value = txn.get(META_SEQUENCE, db=self._db[b"meta"])
            return (U64.unpack(value)[0] if value is not None else 0) + 1

    def events_after(self, sequence: int, limit: int = 1000) -> list[Event]:
        """Reads events with a sequence number greater than ``sequence``, oldest first.

        Args:
            sequence: The last sequence number the reader has seen (0 for the beginning).
            limit: Maximum number of events to return.

        Returns:
            Up to ``limit`` events.
        """
        with self.read() as txn:
            cursor = txn.cursor(db=self._db[b"events"])
            events: list[Event] = []
            if not cursor.set_range(U64.pack(sequence + 1)):
                return events
            for key, value in cursor:
                if len(events) >= limit:
                    break
                events.append(decode_event(U64.unpack(key)[0], value))
            return events

    def prune_events(self, keep: int) -> int:
        """Deletes all but the newest ``keep`` events.

        A watcher that resumes from a pruned sequence gets ``OUT_OF_RANGE`` and re-lists.

        Args:
            keep: Events to keep, at least 0.

        Returns:
            The number of events deleted.

        Raises:
            InvalidArgument: ``keep`` is negative.
            CatalogError: The catalog cannot be written.
        """
        if keep < 0:
            raise InvalidArgument(f"cannot keep {keep} events")
        with self.write() as txn:
            value = txn.get(META_SEQUENCE, db=self._db[b"meta"])
            last = U64.unpack(value)[0] if value is not None else 0
            cursor = txn.cursor(db=self._db[b"events"])
            deleted = 0
            if cursor.first():
                while (key := cursor.key()) and U64.unpack(key)[0] + keep <= last:
                    cursor.delete()
                    deleted += 1
            return deleted
