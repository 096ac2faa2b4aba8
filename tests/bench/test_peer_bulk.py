"""bench.peer_bulk: bad arguments are clear errors; a small run puts gRPC and bulk side by
side, plaintext and under mTLS, every byte accounted for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.peer_bulk import Result, main, markdown


@pytest.mark.parametrize(
    "argv",
    [["--size", "x"], ["--size", "1MiB", "--block-size", "2MiB"], ["--batch", "0"]],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


def test_markdown_gives_mb_s_and_cpu_per_gib() -> None:
    table = markdown([Result("bulk", False, 1 << 30, 1.0, 1.5)])
    assert "| bulk | plaintext | 1,074 | 1.50 |" in table


def test_a_small_run_moves_every_byte_both_ways(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "peer_bulk.json"
    main(["--size", "4MiB", "--block-size", "512KiB", "--batch", "4", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert [(r["transport"], r["secured"]) for r in rows] == [
        ("grpc", False),
        ("bulk", False),
        ("grpc", True),
        ("bulk", True),
    ]
    assert all(r["nbytes"] == 4 << 20 for r in rows)
    assert "| bulk | mTLS |" in capsys.readouterr().out
