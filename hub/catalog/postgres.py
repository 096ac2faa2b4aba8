"""The catalog's records in PostgreSQL, for hub replicas on several machines.

One table holds every record of every named database, ordered as LMDB orders them
(``bytea`` compares byte by byte, then by length: LMDB's default key order)::

    CREATE TABLE strata_kv (db smallint, k bytea, v bytea, PRIMARY KEY (db, k))

``db`` is the index of the database's name in :data:`hub.catalog.schema.DB_NAMES`. The
catalog code is the same as on LMDB; :class:`PgTxn` and :class:`PgCursor` speak the subset
of LMDB's transaction and cursor API it uses (:mod:`hub.catalog.engine`).

**Transactions.** A write transaction is ``BEGIN ISOLATION LEVEL READ COMMITTED`` followed by
``pg_advisory_xact_lock``: writers are serial across every replica and process, and since
each statement of a read-committed transaction sees every commit made before it started,
a writer sees all earlier writes — LMDB's single-writer rule, on which the gap-free event
sequence, write-once versions and gc-versus-protection ordering rest. A read transaction
is ``REPEATABLE READ READ ONLY``: one snapshot for all its statements, like an LMDB read
transaction. A process killed inside a transaction leaves nothing: PostgreSQL aborts it
when the connection drops. Sources: PostgreSQL 15 documentation, chapters 13.2
(transaction isolation) and 9.27.10 (advisory lock functions).

**Failures.** A connection the server closed (restart, failover) is found broken by its
first statement and replaced, once per pooled connection; when no connection can be made
within :data:`CONNECT_TIMEOUT_S`, every call fails with
:class:`~hub.errors.CatalogUnavailable` ("catalog engine … unreachable"), which the hub
answers as ``UNAVAILABLE``; the pool reconnects by itself once the engine is back.

**High availability** is the engine's: run PostgreSQL with a synchronous standby
(``synchronous_commit = on`` with ``synchronous_standby_names``) behind a failover manager
(Patroni, CloudNativePG), and point the hub at the address that follows the primary
(docs/deploy.md).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg_pool

from hub.catalog.env import check_format
from hub.catalog.locations import redact
from hub.catalog.schema import DB_NAMES, META_BLOBS, META_FORMAT
from hub.errors import CatalogError, CatalogUnavailable

# the pool logs every failed reconnection attempt (several a second while the engine is
# down); the hub says once that the catalog is unreachable and once that it is back
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

TABLE = "strata_kv"
"""The table holding the catalog's records."""

WRITER_LOCK = 0x5354_5241_5441  # "STRATA"
"""The advisory lock key every write transaction takes (serializes writers)."""

POOL_SIZE = 8
"""Connections a process keeps to the engine at most (the hub's worker threads share them)."""

CONNECT_TIMEOUT_S = 3.0
"""Seconds to wait for a connection (new, or free in the pool) before a call fails."""

RECONNECT_S = 2.0
"""How long the pool keeps retrying one lost connection before it gives up on it (its
backoff doubles each time, without bound, so a long outage would otherwise be followed by
a long wait); the next call asks for a new one, so recovery takes seconds, not minutes."""

LOCK_TIMEOUT_S = 30.0
"""Seconds a write transaction waits for the writer lock before it fails."""

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


class PostgresEngine:
    """A catalog in a PostgreSQL database (see the module docstring).

    Args:
        url: A libpq connection URI, ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DB[?…]``;
            a password is better given by ``PGPASSFILE`` or ``passfile=`` than in the URL.
        create: Create the table (and stamp the format) when missing; when False a
            database without a catalog raises.

    Raises:
        CatalogUnavailable: The engine cannot be reached.
        CatalogError: The database has no catalog (``create`` False), refuses this user,
            or holds a catalog of another format.
    """

    shared = True

    def __init__(self, url: str, *, create: bool) -> None:
        self.location = redact(url)
        self.dbs: dict[bytes, Any] = {name: index for index, name in enumerate(DB_NAMES)}
        try:
            conninfo = psycopg.conninfo.make_conninfo(
                url, connect_timeout=max(1, int(CONNECT_TIMEOUT_S))
            )
        except psycopg.ProgrammingError as exc:
            raise CatalogError(
                f"catalog URL {self.location} is malformed: {redact(str(exc))}"
            ) from None
        self._conninfo = conninfo
        self._probe()  # the real reason now (refused, no such database, password), not a timeout
        self._pool: psycopg_pool.ConnectionPool[Any] | None = psycopg_pool.ConnectionPool(
            conninfo,
            min_size=1,
            max_size=POOL_SIZE,
            kwargs={"autocommit": True},
            timeout=CONNECT_TIMEOUT_S,
            reconnect_timeout=RECONNECT_S,
            open=False,
            name="strata-catalog",
        )
        self._pool.open(wait=False)
        try:
            self._setup(create)
        except BaseException:
            self.close()
            raise

    def _setup(self, create: bool) -> None:
        with self.begin(write=True) as txn:
            exists = txn._one("SELECT to_regclass(%s) IS NOT NULL", (TABLE,))
            if not exists:
                if not create:
                    raise CatalogError(f"no catalog at {self.location} (nothing published yet?)")
                txn._conn.execute(
                    f"CREATE TABLE {TABLE} (db smallint NOT NULL, k bytea NOT NULL, "
                    "v bytea NOT NULL, PRIMARY KEY (db, k))"
                )
            check_format(txn, self.dbs[b"meta"], self.dbs[b"datasets"], self.location)  # type: ignore[arg-type]

    def _probe(self) -> None:
        """Connects once, outside the pool, and raises what the engine said.

        Raises:
            CatalogError: The server refused this user or database (SQLSTATE class 28, or
                3D000): a setting to fix, not an outage.
            CatalogUnavailable: No server answered.
        """
        try:
            psycopg.connect(self._conninfo, autocommit=True).close()
        except psycopg.Error as exc:
            reason = redact(_first_line(exc))
            state = getattr(exc, "sqlstate", None) or ""
            if state.startswith("28") or state == "3D000" or _refusal(reason):
                raise CatalogError(f"catalog engine {self.location} refused: {reason}") from None
            raise CatalogUnavailable(
                f"catalog engine {self.location} unreachable: {reason}"
            ) from None

    @property
    def pool(self) -> psycopg_pool.ConnectionPool[Any]:
        """The connection pool.

        Raises:
            CatalogError: The engine was closed.
        """
        if self._pool is None:
            raise CatalogError(f"catalog at {self.location} is closed")
        return self._pool

    @contextlib.contextmanager
    def begin(self, *, write: bool) -> Iterator[PgTxn]:
        """A transaction (see the module docstring for its isolation).

        Raises:
            CatalogUnavailable: No connection to the engine could be had, or it broke.
            CatalogError: The engine refused a statement (permissions, a full disk, the
                writer lock not had within :data:`LOCK_TIMEOUT_S`).
        """
        opening = (
            f"BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = "
            f"'{int(LOCK_TIMEOUT_S * 1000)}ms'; SELECT pg_advisory_xact_lock({WRITER_LOCK})"
            if write
            else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        )
        try:
            with self._connection(opening) as conn:
                txn = PgTxn(conn, write=write)
                try:
                    yield txn
                except BaseException:
                    if not conn.broken:
                        conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
        except psycopg_pool.PoolTimeout as exc:
            self._probe()  # raises the engine's own reason when it gives one
            raise CatalogUnavailable(
                f"catalog engine {self.location} unreachable: no connection within "
                f"{CONNECT_TIMEOUT_S:g} s"
            ) from exc
        except psycopg.OperationalError as exc:
            raise CatalogUnavailable(
                f"catalog engine {self.location} unreachable: {_first_line(exc)}"
            ) from exc
        except psycopg.Error as exc:
            raise CatalogError(f"catalog at {self.location}: {_first_line(exc)}") from exc

    @contextlib.contextmanager
    def _connection(self, opening: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection with ``opening`` executed on it; a connection found broken by
        it (the server restarted since it was made) is dropped and another tried."""
        for attempt in range(POOL_SIZE + 1):
            with self.pool.connection() as conn:
                try:
                    conn.execute(opening)
                except psycopg.OperationalError:
                    if not conn.broken or attempt == POOL_SIZE:
                        raise
                    continue  # the pool discards the broken connection on return
                yield conn
                return

    def used_bytes(self) -> int:
        """Bytes of the table and its index (``pg_total_relation_size``)."""
        with self.begin(write=False) as txn:
            return int(txn._one("SELECT pg_total_relation_size(%s)", (TABLE,)))

    def close(self) -> None:
        """Closes the pool; repeated calls have no effect."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()


_REFUSALS = ("password authentication failed", "does not exist", "no password supplied")


def _refusal(reason: str) -> bool:
    """True for a connection the server refused for its settings (libpq's text, where no
    SQLSTATE came back: a failed connection attempt carries none)."""
    return any(words in reason for words in _REFUSALS) or "invalid integer value" in reason


def _first_line(exc: BaseException) -> str:
    """The first line of the engine's message, from its ``FATAL:`` on where it has one
    (libpq puts the address it tried before it, already in the location shown)."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return line[line.index("FATAL:") :] if "FATAL:" in line else line


def load_records(engine: PostgresEngine, records: Iterator[tuple[int, bytes, bytes]]) -> int:
    """Writes ``records`` ((db, key, value), any order) into an EMPTY catalog table in one
    write transaction, with ``COPY`` (one stream, not a statement per record): a copy that
    fails or is killed leaves the table as it was.

    Returns:
        How many records were written.

    Raises:
        CatalogError: The table already holds records other than the format stamp and the
            blob store's location (what a replica started on the new database writes), or
            the engine refused the copy (:class:`~hub.errors.CatalogUnavailable` when
            unreachable).
    """
    written = 0
    with engine.begin(write=True) as txn:
        held = txn._one(
            f"SELECT count(*) FROM {TABLE} WHERE NOT (db = %s AND k IN (%s, %s))",
            (engine.dbs[b"meta"], META_FORMAT, META_BLOBS),
        )
        if held:
            raise CatalogError(
                f"catalog at {engine.location} is not empty ({held} "
                f"record{'s' if held != 1 else ''}): migrate only into a new database"
            )
        txn._conn.execute(f"DELETE FROM {TABLE}")
        with txn._conn.cursor().copy(f"COPY {TABLE} (db, k, v) FROM STDIN") as copy:
            for db, key, value in records:
                copy.write_row((db, key, value))
                written += 1
    return written
