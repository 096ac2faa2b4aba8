"""deploy/catalog/roles.sql against a real PostgreSQL (Debian's, tests/pgserver.py): run
by ``psql`` as docs/deploy.md runs it (twice: it is idempotent), then ``strata-hub``
commands as each role. ``strata_publish`` publishes, tags, collects garbage and
migrates; ``strata_serve`` serves (starts, records the grant key, rotates it, resolves
and reads a dataset) and every write it must not make is refused."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

from deploy.local import LocalStack
from hub.catalog.postgres import TABLE, PostgresEngine
from hub.catalog.schema import DB_NAMES, META_BLOBS, META_FORMAT, META_GRANT_KEY
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc
from tests.conftest import REPO_ROOT
from tests.pgserver import PostgresServer, pg_server  # noqa: F401  (the pg_server fixture)

ROLES_SQL = REPO_ROOT / "deploy" / "catalog" / "roles.sql"


def hub(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hub", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def psql(server: PostgresServer, url: str) -> None:
    done = subprocess.run(
        [
            str(server.bindir / "psql"),
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-f",
            str(ROLES_SQL),
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def as_role(url: str, role: str) -> str:
    """``url`` (the superuser's, trust authentication) with ``role`` as its user."""
    return url.replace("postgresql://postgres@", f"postgresql://{role}@", 1)


@pytest.fixture
def catalog(pg_server: PostgresServer) -> Iterator[str]:  # noqa: F811
    """A fresh database prepared by roles.sql (run twice); its superuser URL."""
    url = pg_server.database()
    psql(pg_server, url)
    psql(pg_server, url)
    yield url


def _columns(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        columns = conn.execute(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_name = %s ORDER BY ordinal_position",
            (TABLE,),
        ).fetchall()
        key = conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary "
            "ORDER BY a.attnum",
            (TABLE,),
        ).fetchall()
    return [*columns, *key]


def test_the_table_is_the_hubs(pg_server: PostgresServer, catalog: str) -> None:  # noqa: F811
    """roles.sql's table is the one PostgresEngine makes, and its meta keys are the
    schema's (db 0 is ``meta``)."""
    fresh = pg_server.database()
    PostgresEngine(fresh, create=True).close()
    assert _columns(catalog) == _columns(fresh)
    assert DB_NAMES[0] == b"meta"
    text = ROLES_SQL.read_text()
    for key in (META_FORMAT, META_BLOBS, META_GRANT_KEY):
        assert f"'{key.decode()}'::bytea" in text, key


def _resolve(address: str, dataset: str, ref: str) -> hub_pb2.Snapshot:
    with grpc.insecure_channel(address) as channel:
        return hub_pb2_grpc.HubStub(channel).ResolveRef(
            hub_pb2.ResolveRefRequest(dataset=dataset, ref=ref), timeout=10
        )


def _refused(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode != 0, done.stdout
    assert "row-level security" in done.stderr or "permission denied" in done.stderr, done.stderr


def test_publish_role_writes_and_serve_role_only_serves(catalog: str, tmp_path: Path) -> None:
    publisher, server = as_role(catalog, "strata_publish"), as_role(catalog, "strata_serve")
    blobs = tmp_path / "blobs"
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"strata" * 50_000)
    admin = ["--data-dir", str(tmp_path / "admin"), "--catalog", publisher]
    done = hub("publish", *admin, "--blobs", str(blobs), "f3", str(src))
    assert done.returncode == 0 and done.stdout.strip() == "v1", done.stderr
    key, rotated = tmp_path / "grant.key", tmp_path / "grant2.key"
    for private in (key, rotated):
        assert hub("keygen", str(private), str(private.with_suffix(".pub"))).returncode == 0

    serve = ["--catalog", server, "--blobs", str(blobs), "--insecure"]
    with LocalStack() as stack:
        # the first replica records the grant key (an INSERT the policy allows)
        address = stack.start_hub(tmp_path / "r1", extra=(*serve, "--grant-key", str(key)))
        snapshot = _resolve(address, "f3", "latest")
        assert snapshot.version == "v1"
        # a rotation replaces it (the one UPDATE the policy allows)
        second = (*serve, "--grant-key", str(rotated), "--rotate-grant-key")
        assert _resolve(stack.start_hub(tmp_path / "r2", extra=second), "f3", "v1") == snapshot

    as_server = ["--data-dir", str(tmp_path / "serve-admin"), "--catalog", server]
    _refused(hub("publish", *as_server, "f3", str(src)))
    _refused(hub("tag", *as_server, "f3", "v1", "stable"))
    _refused(hub("revoke", *as_server, "f3", "v1"))
    # gc's catalog side is reads under the writer lock until it drops a publish or prunes
    # events; what keeps a replica from deleting blobs is its read-only bucket key
    _refused(hub("gc", *as_server, "--keep-events", "0"))
    assert hub("ls", *as_server, "f3").returncode == 0, "reading is what serve does"
    with psycopg.connect(server, autocommit=True) as conn:
        for statement in (
            f"INSERT INTO {TABLE} VALUES (1, 'f4', 'x')",  # row-level security: 42501 too
            f"DELETE FROM {TABLE}",
            f"TRUNCATE {TABLE}",
            f"ALTER TABLE {TABLE} DISABLE ROW LEVEL SECURITY",
            f"DROP TABLE {TABLE}",
            "CREATE TABLE strata_other (x int)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
        # an UPDATE sees only the grant key's row: every other matches nothing
        for where in ("db = 0 AND k = 'blobs'", "db = 0 AND k = 'format'", "db <> 0"):
            done = conn.execute(f"UPDATE {TABLE} SET v = 'elsewhere' WHERE {where}")
            assert done.rowcount == 0, where

    # the publish role: everything a data team and the gc schedule run
    assert hub("tag", *admin, "f3", "v1", "stable").returncode == 0
    (src / "b.bin").write_bytes(b"more" * 10_000)
    assert hub("publish", *admin, "f3", str(src)).stdout.strip() == "v2"
    assert hub("revoke", *admin, "f3", "v1").returncode == 0
    done = hub("gc", *admin)
    assert done.returncode == 0, done.stderr
    with (
        psycopg.connect(publisher, autocommit=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute(f"DROP TABLE {TABLE}")


def test_migrate_as_the_publish_role(
    pg_server: PostgresServer,  # noqa: F811
    catalog: str,
    tmp_path: Path,
) -> None:
    """``strata-hub migrate`` into a database roles.sql prepared: it copies with COPY,
    which PostgreSQL refuses under row-level security, so strata_publish is made a member
    of the table's owner for the copy and removed after (docs/deploy.md)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"lmdb" * 10_000)
    data = tmp_path / "hub"
    assert hub("publish", "--data-dir", str(data), "f3", str(src)).returncode == 0
    migrate = ["migrate", "--data-dir", str(data), "--catalog", as_role(catalog, "strata_publish")]
    done = hub(*migrate)
    assert done.returncode != 0 and "row-level security" in done.stderr, done.stderr
    with psycopg.connect(catalog, autocommit=True) as conn:
        conn.execute("GRANT strata_owner TO strata_publish")
    done = hub(*migrate)
    with psycopg.connect(catalog, autocommit=True) as conn:
        conn.execute("REVOKE strata_owner FROM strata_publish")
    assert done.returncode == 0, done.stderr
    done = hub("ls", "--data-dir", str(data), "--catalog", as_role(catalog, "strata_serve"), "f3")
    assert done.returncode == 0 and "v1" in done.stdout, done.stderr
