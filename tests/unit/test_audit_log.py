"""The audit trail hub and spoke share (``strata_local.audit``): rotation by size and count into
owner-only files, fields cut to a few hundred characters, refusals rate-limited with an
exact count of what was left out."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from strata_local.audit import FIELD_CHARS, SUMMARY_S, AuditLog, TokenBucket, truncate


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def lines(path: Path) -> list[dict[str, Any]]:
    """Every record of ``path`` and its rotated files, oldest first."""
    files = sorted(path.parent.glob(path.name + ".*"), key=lambda p: -int(p.suffix[1:]))
    out: list[dict[str, Any]] = []
    for file in [*files, path]:
        if file.exists():
            out += [json.loads(line) for line in file.read_text().splitlines()]
    return out


def test_rotates_by_size_and_count_into_owner_only_files(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    old = os.umask(0o022)
    try:
        audit = AuditLog(path, max_bytes=2048, backups=2)
        for i in range(200):
            audit.record(who="tester", what=f"action {i}", outcome="ok")
        audit.close()
    finally:
        os.umask(old)
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    for file in files:
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
        assert file.stat().st_size <= 2048
    assert sum(f.stat().st_size for f in files) <= audit.cap_bytes
    kept = [int(r["what"].split()[1]) for r in lines(path)]
    assert kept == list(range(200 - len(kept), 200))  # the newest, in order, none torn


def test_an_existing_file_is_made_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text("")
    path.chmod(0o644)
    audit = AuditLog(path)
    audit.record(who="w", what="x", outcome="ok")
    audit.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_every_field_is_cut_with_its_length_noted(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl")
    long = "/v1/" + "x" * 60_000
    audit.refused(who="1.2.3.4:5", what=f"GET {long}", outcome="denied", path=long, n=3)
    audit.record(
        who="w" * 1000, what="ok", outcome="o" * 300, tags=["a" * 500], many=list(range(99))
    )
    audit.close()
    first, second = lines(tmp_path / "audit.jsonl")
    assert first["what"] == f"GET {long}"[:FIELD_CHARS] + f"…[{len(long) + 4} chars]"
    assert first["path"] == truncate(long) and first["n"] == 3
    assert len(second["who"]) < FIELD_CHARS + 20 and second["outcome"].endswith("[300 chars]")
    assert second["tags"] == [truncate("a" * 500)] and second["many"] == "99 items"
    assert (tmp_path / "audit.jsonl").stat().st_size < 2000


def test_refusals_are_rate_limited_and_what_was_left_out_is_counted(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path, refusals_per_s=1.0, burst=5, clock=clock)
    for i in range(20):
        audit.refused(who=f"peer {i}", what="GET /v1/cache", outcome="denied")
    audit.record(who="operator", what="POST /v1/pins", outcome="201")  # never dropped
    assert audit.suppressed() == 15
    assert [r["outcome"] for r in lines(path)] == ["denied"] * 5 + ["201"]
    clock.now = SUMMARY_S  # tokens are back, and a summary is due
    audit.refused(who="peer 20", what="GET /v1/cache", outcome="denied")
    audit.refused(who="peer 21", what="POST /v1/evict", outcome="refused: body too large")
    records = lines(path)
    summary = records[6]
    assert (summary["what"], summary["outcome"]) == ("rate limit", "suppressed")
    assert summary["suppressed"] == 15 and summary["by_outcome"] == {"denied": 15}
    assert [r["who"] for r in records[7:]] == ["peer 20", "peer 21"]
    for _ in range(100):  # a flood that goes on: at most one summary per SUMMARY_S
        audit.refused(who="p", what="w", outcome="denied")
    clock.now += 1.0
    audit.refused(who="p", what="w", outcome="denied")
    assert sum(r["outcome"] == "suppressed" for r in lines(path)) == 1
    audit.close()  # the pending count is written on close
    records = lines(path)
    written = sum(r["outcome"] != "suppressed" and r["outcome"] != "201" for r in records)
    left_out = sum(r.get("suppressed", 0) for r in records)
    assert written + left_out == 20 + 2 + 101  # every refusal written or counted
    assert records[-1]["outcome"] == "suppressed"


def test_a_write_error_is_logged_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    audit = AuditLog(tmp_path / "missing-dir" / "audit.jsonl")
    with caplog.at_level(logging.ERROR):
        audit.record(who="w", what="x", outcome="ok")
    assert "cannot write a record" in caplog.text
    audit.close()


def test_token_bucket() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=2.0, burst=3, clock=clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    clock.now = 0.5  # one token back
    assert [bucket.take(), bucket.take()] == [True, False]
    clock.now = 100.0  # never more than the burst
    assert sum(bucket.take() for _ in range(10)) == 3
    with pytest.raises(ValueError):
        TokenBucket(rate=0, burst=1)
    with pytest.raises(ValueError):
        AuditLog(Path("/nonexistent/x"), max_bytes=10)
