"""One catalog transaction in PostgreSQL with LMDB's transaction and cursor API
(:class:`PgTxn`, :class:`PgCursor`): the subset the catalog uses
(:mod:`hub.catalog.engine`), over the one table :mod:`hub.catalog.postgres` describes.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import psycopg

TABLE = "strata_kv"
"""The table holding the catalog's records."""

FIRST_PAGE = 16
"""Records a cursor fetches first; each further fetch takes 4 times more, up to MAX_PAGE."""

MAX_PAGE = 1024


class PgCursor:
    """A cursor over one database of a :class:`PgTxn`, with LMDB's cursor API.

    Records are fetched a page at a time, in key order. A write through the same
    transaction to the same database makes the cursor fetch again from where it stands,
    so it sees the transaction's own writes as an LMDB cursor does.
    """

    def __init__(self, txn: PgTxn, db: int) -> None:
        self._txn = txn
        self._db = db
        self._rows: list[tuple[bytes, bytes]] = []
        self._pos = 0
        self._more = False
        self._stale = False
        self._page = FIRST_PAGE
        self._started = False

    def _fetch(self, key: bytes | None, *, inclusive: bool) -> bool:
        self._started = True
        self._rows = self._txn.range(self._db, key, inclusive=inclusive, limit=self._page)
        self._more = len(self._rows) == self._page
        self._page = min(self._page * 4, MAX_PAGE)
        self._pos = 0
        self._stale = False
        return bool(self._rows)

    def invalidate(self) -> None:
        """Marks the fetched page as possibly out of date (a write to this database)."""
        self._stale = True

    @property
    def _positioned(self) -> bool:
        return self._pos < len(self._rows)

    def first(self) -> bool:
        """Moves to the first record; False when the database is empty."""
        self._page = FIRST_PAGE
        return self._fetch(None, inclusive=True)

    def set_range(self, key: bytes) -> bool:
        """Moves to the first record at or after ``key``; False when there is none."""
        self._page = FIRST_PAGE
        return self._fetch(key, inclusive=True)

    def key(self) -> bytes:
        """The current record's key, or ``b""`` when not positioned."""
        return self._rows[self._pos][0] if self._positioned else b""

    def value(self) -> bytes:
        """The current record's value, or ``b""`` when not positioned."""
        return self._rows[self._pos][1] if self._positioned else b""

    def next(self) -> bool:
        """Moves to the next record (the first when not positioned); False at the end."""
        if not self._positioned:
            if self._started:
                return False
            return self.first()
        current = self._rows[self._pos][0]
        self._pos += 1
        if self._stale or (not self._positioned and self._more):
            return self._fetch(current, inclusive=False)
        return self._positioned

    def delete(self) -> bool:
        """Deletes the current record and moves to the next; False when not positioned."""
        if not self._positioned:
            return False
        current = self._rows[self._pos][0]
        self._txn.delete(current, db=self._db)
        self._fetch(current, inclusive=False)
        return True

    def delete_prefix(self, prefix: bytes) -> int:
        """Deletes every record whose key starts with ``prefix`` in one statement."""
        deleted = self._txn.delete_prefix(self._db, prefix)
        self._rows, self._pos, self._started = [], 0, True
        return deleted

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        """Yields (key, value) from the current record on (from the first if unpositioned)."""
        if not self._positioned and not self._started and not self.first():
            return
        while self._positioned:
            yield self._rows[self._pos]
            if not self.next():
                return


class PgTxn:
    """One transaction on the catalog table, with LMDB's transaction API.

    Args:
        conn: A connection with a transaction open (``BEGIN`` sent).
        write: False for a read-only transaction (PostgreSQL refuses its writes).
    """

    def __init__(self, conn: psycopg.Connection[Any], *, write: bool) -> None:
        self._conn = conn
        self.write = write
        self._cursors: weakref.WeakSet[PgCursor] = weakref.WeakSet()

    def _one(self, query: str, params: tuple[Any, ...]) -> Any:
        row = self._conn.execute(query, params).fetchone()
        return None if row is None else row[0]

    def get(self, key: bytes, *, db: int) -> bytes | None:
        """The value at ``key`` in ``db``, or None."""
        value = self._one(f"SELECT v FROM {TABLE} WHERE db = %s AND k = %s", (db, key))
        return None if value is None else bytes(value)

    def put(self, key: bytes, value: bytes, *, db: int, overwrite: bool = True) -> bool:
        """Stores ``value`` at ``key``; False when ``overwrite`` is off and the key exists."""
        action = "DO UPDATE SET v = EXCLUDED.v" if overwrite else "DO NOTHING"
        cur = self._conn.execute(
            f"INSERT INTO {TABLE} (db, k, v) VALUES (%s, %s, %s) ON CONFLICT (db, k) {action}",
            (db, key, value),
        )
        self._touched(db)
        return cur.rowcount == 1

    def delete(self, key: bytes, *, db: int) -> bool:
        """Deletes ``key``; False when it was absent."""
        cur = self._conn.execute(f"DELETE FROM {TABLE} WHERE db = %s AND k = %s", (db, key))
        self._touched(db)
        return cur.rowcount == 1

    def delete_prefix(self, db: int, prefix: bytes) -> int:
        """Deletes every key of ``db`` starting with ``prefix``; returns how many."""
        if not prefix:
            cur = self._conn.execute(f"DELETE FROM {TABLE} WHERE db = %s", (db,))
        else:
            cur = self._conn.execute(
                f"DELETE FROM {TABLE} WHERE db = %s AND k >= %s AND substring(k for %s) = %s",
                (db, prefix, len(prefix), prefix),
            )
        self._touched(db)
        return cur.rowcount

    def range(
        self, db: int, key: bytes | None, *, inclusive: bool, limit: int
    ) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` records of ``db`` from ``key`` on (all when None), in key order."""
        if key is None:
            rows = self._conn.execute(
                f"SELECT k, v FROM {TABLE} WHERE db = %s ORDER BY k LIMIT %s", (db, limit)
            ).fetchall()
        else:
            op = ">=" if inclusive else ">"
            rows = self._conn.execute(
                f"SELECT k, v FROM {TABLE} WHERE db = %s AND k {op} %s ORDER BY k LIMIT %s",
                (db, key, limit),
            ).fetchall()
        return [(bytes(k), bytes(v)) for k, v in rows]

    def cursor(self, *, db: int) -> PgCursor:
        """A cursor over ``db``."""
        cursor = PgCursor(self, db)
        self._cursors.add(cursor)
        return cursor

    def stat(self, db: int) -> dict[str, int]:
        """``{"entries": N}``: the records in ``db`` (a count: O(N), unlike LMDB's)."""
        return {"entries": int(self._one(f"SELECT count(*) FROM {TABLE} WHERE db = %s", (db,)))}

    def _touched(self, db: int) -> None:
        for cursor in list(self._cursors):
            if cursor._db == db:
                cursor.invalidate()
