"""The catalog's records in PostgreSQL, for hub replicas on several machines.

One table holds every record of every named database, ordered as LMDB orders them
(``bytea`` compares byte by byte, then by length: LMDB's default key order)::

    CREATE TABLE strata_kv (db smallint, k bytea, v bytea, PRIMARY KEY (db, k))

``db`` is the index of the database's name in :data:`hub.catalog.schema.DB_NAMES`. The
catalog code is the same as on LMDB; :class:`~hub.catalog.pgtxn.PgTxn` and
:class:`~hub.catalog.pgtxn.PgCursor` speak the subset
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
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg_pool

from hub.catalog.env import check_format
from hub.catalog.locations import redact
from hub.catalog.pgtxn import TABLE, PgTxn
from hub.catalog.schema import DB_NAMES, META_BLOBS, META_FORMAT
from hub.errors import CatalogError, CatalogUnavailable

# the pool logs every failed reconnection attempt (several a second while the engine is
# down); the hub says once that the catalog is unreachable and once that it is back
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

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
