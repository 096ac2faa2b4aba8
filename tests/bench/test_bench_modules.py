"""Every benchmark module imports (the harness's own modules are type-checked; the others
are run by hand or by `make bench`, so a renamed name they import must fail here first)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import bench

MODULES = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.ispkg)


@pytest.mark.parametrize("name", MODULES)
def test_the_benchmark_module_imports_and_has_an_entry_point(name: str) -> None:
    module = importlib.import_module(f"bench.{name}")
    assert module.__doc__, f"bench.{name} says what it measures"
    if name in {"small_files", "hint_start", "prewarm_link", "policy_sim", "hints_mount"}:
        assert callable(module.main)  # `make bench` runs these (or the README names them)
