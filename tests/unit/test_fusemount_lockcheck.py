"""fusemount.lockcheck: one WARNING at mount start when pyfuse3 leaves locks to the kernel."""

from __future__ import annotations

import logging

import pyfuse3
import pytest

from fusemount import lockcheck


def test_a_pyfuse3_without_the_lock_handlers_is_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="fusemount.lockcheck"):
        assert lockcheck.warn_unless_granted(lambda: False) is False
    assert [r.getMessage() for r in caplog.records] == [lockcheck.KERNEL_LOCKS_WARNING]
    assert "one reader's flock or fcntl lock can block every other reader" in caplog.text


def test_the_patched_build_is_not_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="fusemount.lockcheck"):
        assert lockcheck.warn_unless_granted(lambda: True) is True
    assert caplog.records == []


def test_the_library_check_reads_locks_granted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyfuse3, "locks_granted", lambda: True, raising=False)
    assert lockcheck.library_grants_locks() is True
    monkeypatch.delattr(pyfuse3, "locks_granted")
    assert lockcheck.library_grants_locks() is False
