"""The ``strata-train fit`` command line that the benchmarks and the demo run."""

from __future__ import annotations

from pathlib import Path

from trainer.command import fit_args


def test_fit_args_without_options_are_the_demos() -> None:
    args = fit_args(Path("/m/f3.mdio"), Path("/w/train"), 300, batch_size=8, workers=2)
    assert args == [
        "trainer", "fit", "--data", "/m/f3.mdio", "--steps", "300", "--preset", "tiny",
        "--batch-size", "8", "--workers", "2", "--out", "/w/train",
    ]  # fmt: skip


def test_fit_args_with_every_option_are_the_benchmarks() -> None:
    args = fit_args(
        Path("d"), Path("o"), 3, batch_size=4, workers=0, seed=7, log_every=1, checkpoint_every=0
    )
    assert args == [
        "trainer", "fit", "--data", "d", "--steps", "3", "--preset", "tiny",
        "--batch-size", "4", "--workers", "0", "--seed", "7", "--log-every", "1",
        "--checkpoint-every", "0", "--out", "o",
    ]  # fmt: skip


def test_every_flag_is_one_fit_accepts() -> None:
    from typer.testing import CliRunner

    from trainer.cli import app

    help_text = CliRunner().invoke(app, ["fit", "--help"], terminal_width=200).output
    args = fit_args(Path("d"), Path("o"), 1, batch_size=1, workers=0, seed=0, log_every=1,
                    checkpoint_every=0)  # fmt: skip
    for flag in (a for a in args if a.startswith("--")):
        assert flag in help_text
