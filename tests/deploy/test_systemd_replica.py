"""deploy/systemd's hub unit with its drop-ins (``s3.conf``, ``catalog.conf``) runs as a
hub replica over a shared catalog, as an unprivileged user, with every secret a
credential: its own ``ExecStart=`` and environment resolved as systemd resolves them
(tests/deploy/systemd_support.py), run as ``nobody`` (the stand-in for its
``DynamicUser=``) against a real PostgreSQL.

The shipped unit failed each step: it had no ``--grant-key`` (a replica refuses to start
without one), its ``PGPASSFILE`` pointed at a root-only file its user cannot read (libpq
then sends no password), and the bucket key came from the environment."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from deploy.local import free_port
from deploy.pki import LocalCa
from hub.auth.grants import GrantIssuer
from hub.catalog.postgres import TABLE
from hub.catalog.schema import META_GRANT_KEY
from tests.conftest import REPO_ROOT
from tests.deploy.systemd_support import Service, prepare
from tests.support import eventually

UNIT = REPO_ROOT / "deploy" / "systemd" / "strata-hub.service"
PASSWORD = "catalog-password-of-strata-serve"
S3_KEY = "AKIASTRATAFROMAFILE"
BINDIR = Path(sys.executable).parent

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run the unit's command as another user",
)


@pytest.fixture
def region_a(pg_url: str) -> Iterator[tuple[Path, dict[str, Path], str]]:
    """A root directory of this test, /etc/strata as the operator fills it (root-only),
    and the catalog's URL; made under the temporary directory (pytest's own is private
    to root, and the service runs as nobody)."""
    root = Path(tempfile.mkdtemp(prefix="strata-systemd-"))
    root.chmod(0o711)
    etc = root / "etc"
    etc.mkdir(mode=0o700)
    ca = LocalCa(etc)
    hub = ca.issue("hub")
    shutil.copyfile(hub.cert, etc / "tls.crt")
    shutil.copyfile(hub.key, etc / "tls.key")
    shutil.copyfile(ca.cert, etc / "ca.crt")
    shutil.copyfile(ca.cert, etc / "catalog-ca.crt")
    hub_cli = BINDIR / "strata-hub"
    commands: list[list[str | Path]] = [
        [hub_cli, "keygen", etc / "grant.key", etc / "grant.pub"],
        [hub_cli, "token", "create", "--tokens", etc / "tokens.yaml", "--dataset", "*"],
    ]
    for argv in commands:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
    host, _, rest = pg_url.removeprefix("postgresql://postgres@").partition(":")
    port, _, database = rest.partition("/")
    (etc / "pgpass").write_text(f"{host}:{port}:{database}:postgres:{PASSWORD}\n")
    (etc / "s3-credentials").write_text(
        f"[default]\naws_access_key_id = {S3_KEY}\naws_secret_access_key = from-the-file\n"
    )
    blobs = root / "blobs"
    blobs.mkdir()
    nobody = pwd.getpwnam("nobody")
    os.chown(blobs, nobody.pw_uid, nobody.pw_gid)
    # hub.env as the unit's header says, plus the bucket key an old one carried, which
    # the unit must drop (its PGPASSFILE must go too: hub.env would win over catalog.conf)
    (etc / "hub.env").write_text(
        "STRATA_HUB_BULK_PORT=0\n"
        f"STRATA_HUB_BLOBS={blobs}\n"
        f"STRATA_HUB_CATALOG={pg_url}\n"
        "AWS_DEFAULT_REGION=region-a\n"
        "AWS_ACCESS_KEY_ID=AKIAFROMTHEENVIRONMENT\n"
        "AWS_SECRET_ACCESS_KEY=from-the-environment\n"
    )
    for path in etc.iterdir():
        path.chmod(0o600)
    files = {f"/etc/strata/hub/{p.name}": p for p in etc.iterdir()}
    try:
        yield root, files, pg_url
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _service(root: Path, files: dict[str, Path], name: str) -> Service:
    """The unit resolved for one machine: its own state directory, credentials and
    hub.env (the shared one with this machine's ports)."""
    nobody = pwd.getpwnam("nobody")
    state = root / name
    state.mkdir(mode=0o700)
    os.chown(state, nobody.pw_uid, nobody.pw_gid)
    env = root / "etc" / f"{name}.env"
    env.write_text(
        files["/etc/strata/hub/hub.env"].read_text()
        + f"STRATA_HUB_LISTEN=127.0.0.1:{free_port()}\n"
        + f"STRATA_HUB_METRICS=127.0.0.1:{free_port()}\n"
    )
    return prepare(
        UNIT,
        etc={**files, "/etc/strata/hub.env": env},
        credentials=root / f"{name}-credentials",
        state=state,
        uid=nobody.pw_uid,
        gid=nobody.pw_gid,
        bindir=BINDIR,
    )


def _as_service_user(argv: list[str]) -> list[str]:
    """``argv`` as the service's user (``nobody``, standing in for its dynamic user)."""
    nobody = pwd.getpwnam("nobody")
    return [
        "setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
        "--", *argv,
    ]  # fmt: skip


PROBE = """
import os, psycopg, botocore.session
with psycopg.connect(os.environ["STRATA_HUB_CATALOG"], connect_timeout=5) as conn:
    print(conn.info.password)
print(open(os.environ["PGSSLROOTCERT"]).read().startswith("-----BEGIN CERTIFICATE"))
credentials = botocore.session.Session().get_credentials()
print(credentials.access_key, credentials.method)
"""


def test_the_units_user_reads_its_catalog_password_and_bucket_key(
    region_a: tuple[Path, dict[str, Path], str],
) -> None:
    """libpq and botocore, in the unit's environment as its user, find the password and
    the key in the credentials directory; the environment's key is gone. (The catalog
    here trusts every connection, so the password is seen where libpq read it, not by the
    server: ``PQpass``.)"""
    root, files, _ = region_a
    service = _service(root, files, "probe")
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(service.env)
    done = subprocess.run(
        _as_service_user([sys.executable, "-c", PROBE]),
        env=service.env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == [PASSWORD, "True", f"{S3_KEY} shared-credentials-file"]
    assert "WARNING" not in done.stderr, done.stderr  # libpq warns of a file others can read


def _ready(metrics: str, process: subprocess.Popen[str], timeout: float = 60.0) -> None:
    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://{metrics}/readyz", timeout=2) as reply:
                return bool(reply.status == 200)
        except (urllib.error.URLError, OSError):
            pass
        if process.poll() is not None:
            _, err = process.communicate()
            pytest.fail(f"the unit's hub exited {process.returncode}: {err[-3000:]}")
        return False

    eventually(answers, f"the unit's hub ready on {metrics}", timeout)


def _start(service: Service) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _as_service_user(service.argv),
        env=service.env,
        cwd="/",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_two_replicas_start_from_the_unit(region_a: tuple[Path, dict[str, Path], str]) -> None:
    """Two replicas of the unit (two state directories, one set of credentials) serve the
    one catalog, signing read grants with the one key file, which the first recorded."""
    root, files, catalog = region_a
    processes: list[subprocess.Popen[str]] = []
    try:
        for name in ("replica-1", "replica-2"):
            service = _service(root, files, name)
            assert "--grant-key=" + str(service.credentials / "grant.key") in service.argv
            processes.append(_start(service))
            _ready(service.env["STRATA_HUB_METRICS"], processes[-1])
        with psycopg.connect(catalog) as conn:
            row = conn.execute(
                f"SELECT v FROM {TABLE} WHERE db = 0 AND k = %s", (META_GRANT_KEY,)
            ).fetchone()
        expected = GrantIssuer.from_file(files["/etc/strata/hub/grant.key"], 120.0).key_id
        assert row is not None and bytes(row[0]).decode() == expected
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=40)  # the unit's TimeoutStopSec
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    assert [p.returncode for p in processes] == [0, 0], "SIGTERM ends a replica cleanly"
