"""Fixtures shared by every test level."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def seismic_dir() -> Path:
    """Where the shared real seismic files are.

    ``$STRATA_SEISMIC_DIR`` if set, else ``<repo>/../shared/data/seismic``.
    """
    env = os.environ.get("STRATA_SEISMIC_DIR")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data" / "seismic"


@pytest.fixture(scope="session")
def seismic() -> Path:
    """Directory holding f3.sgy and the other shared SEG-Y files (skips when absent)."""
    d = seismic_dir()
    if not (d / "f3.sgy").is_file():
        pytest.skip(f"shared seismic data not found at {d}")
    return d
