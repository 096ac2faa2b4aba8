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


LONGEST_FILES = (
    "tests/e2e/test_demo_flow.py",
    "tests/e2e/test_bench_hints_smoke.py",
    "tests/e2e/test_bench_smoke.py",
    "tests/bench/test_direct_stream.py",
    "tests/integration/test_spoke_mesh.py",
    "tests/integration/test_spoke_mesh_trust.py",
    "tests/fuse/test_cache_engine.py",
    "tests/integration/test_connection_floods.py",
    "tests/fuse/test_bulk_mount.py",
    "tests/component/test_trainer_fit.py",
    "tests/fuse/test_restarts.py",
    "tests/fuse/test_hub_security_mount.py",
    "tests/fuse/test_faults.py",
    "tests/integration/test_hub_budget.py",
    "tests/fuse/test_passthrough.py",
    "tests/integration/test_trainer_s3.py",
    "tests/integration/test_spoke_mesh_budget.py",
    "tests/fuse/test_mount_workers.py",
    "tests/fuse/test_hub_failover.py",
    "tests/unit/test_spoke_policy_invariants.py",
    "tests/fuse/test_succession.py",
    "tests/fuse/test_succession_pods.py",
    "tests/integration/test_floods.py",
    "tests/integration/test_hub_replicas.py",
)
"""The files that take longest (20 s to over 2 min each on a 2-core machine), longest first.

``make pytest`` hands whole files to its workers in collection order
(``--dist loadfile --no-loadscope-reorder``): these go first, and the many short files
after them even out the workers' ends. (xdist's default order, most tests first, handed
out the one-test benchmark smoke runs last, and one worker ran them alone while the
other had nothing left.) A file missing here only runs later; keep the list to the
longest few."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files of :data:`LONGEST_FILES` first, in its order; every other test, and the
    tests within each file, in the order collected."""
    rank = {path: i for i, path in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))
