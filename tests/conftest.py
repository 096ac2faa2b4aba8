"""Fixtures shared by every test level."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# fixtures every level may use: a real PostgreSQL server, and each catalog engine in turn
from tests.catalogs import engine  # noqa: F401
from tests.pgserver import pg_server, pg_url  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parent.parent

# One mount worker in every spoke a test starts, whatever this machine's cores (the
# default is one per 4 cores): tests that read the root's counters or count hand-overs
# mean one process. tests/fuse/test_mount_workers.py asks for its workers by flag.
os.environ.setdefault("STRATA_SPOKE_MOUNT_WORKERS", "1")


def seismic_dir() -> Path:
    """Where the shared real seismic files are.

    ``$STRATA_SEISMIC_DIR`` if set, else ``<repo>/../shared/data/seismic``.
    """
    env = os.environ.get("STRATA_SEISMIC_DIR")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data" / "seismic"


@pytest.fixture(scope="session")
def seismic() -> Path:
    """Directory holding f3.sgy and the other shared SEG-Y files.

    Skips the test when absent, except under CI (``$CI`` set), where it fails.
    """
    d = seismic_dir()
    if not (d / "f3.sgy").is_file():
        message = f"shared seismic data not found at {d} (set STRATA_SEISMIC_DIR)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI always has ../shared: never pass by skipping
        pytest.skip(message)
    return d
