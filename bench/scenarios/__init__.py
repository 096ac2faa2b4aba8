"""The scenarios of :mod:`bench.run`, in the order they run.

Each implements :class:`~bench.scenarios.base.Scenario`: :mod:`~bench.scenarios.local`
(local disk), :mod:`~bench.scenarios.floor` (Python FUSE's floor over the local files),
:mod:`~bench.scenarios.copy_first` (download, then read) and
:mod:`~bench.scenarios.remote` (Strata, rclone, httpdirfs behind the link),
:mod:`~bench.scenarios.epochs` (the loader-only load for several epochs, direct streaming
from the bucket beside Strata). The measures
they are made of are in :mod:`~bench.scenarios.phases`.
"""

from __future__ import annotations

from bench.scenarios.base import LABELS, BenchError, Context, Row, Scenario, Settings
from bench.scenarios.copy_first import CopyFirstScenario
from bench.scenarios.epochs import EpochsScenario
from bench.scenarios.floor import FloorScenario
from bench.scenarios.local import LocalScenario
from bench.scenarios.remote import HttpdirfsScenario, RcloneScenario, StrataScenario

SCENARIOS: tuple[Scenario, ...] = (
    LocalScenario(),
    FloorScenario(),
    CopyFirstScenario(),
    StrataScenario(),
    RcloneScenario(),
    HttpdirfsScenario(),
    EpochsScenario(),
)
"""Every scenario, in the order they run."""

BY_GROUP: dict[str, Scenario] = {s.group: s for s in SCENARIOS}
"""Scenarios by group name (what ``--only`` picks)."""

__all__ = [
    "BY_GROUP",
    "LABELS",
    "SCENARIOS",
    "BenchError",
    "Context",
    "Row",
    "Scenario",
    "Settings",
]
