"""strata-train's one schema (trainer/settings.py): the options fit, load, plan and eval share
are declared once, each is a flag and a STRATA_TRAIN_* variable (fit's also a TOML key), and
flags win over variables over the file. No command here gets as far as importing torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from trainer.cli import app
from trainer.cliopts import settings
from trainer.options import FitOptions
from trainer.settings import (
    ENV_PREFIX,
    EvalSettings,
    FitSettings,
    LoadSettings,
    PlanSettings,
    SamplingSettings,
    TrainSettings,
)

COMMANDS: dict[str, type[TrainSettings]] = {
    "fit": FitSettings,
    "load": LoadSettings,
    "plan": PlanSettings,
    "eval": EvalSettings,
}


@pytest.fixture(autouse=True)
def _no_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in FitSettings.model_fields | LoadSettings.model_fields | PlanSettings.model_fields:
        monkeypatch.delenv(ENV_PREFIX + name.upper(), raising=False)
    monkeypatch.delenv("STRATA_TRAIN_CONFIG", raising=False)


def _flags(command: str) -> list[str]:
    params = typer.main.get_command(app).commands[command].params  # type: ignore[attr-defined]
    return [opt for p in params for opt in (*p.opts, *p.secondary_opts)]


def test_each_command_offers_each_field_once_and_shares_the_sampling_flags() -> None:
    for command, model in COMMANDS.items():
        flags = _flags(command)
        assert len(flags) == len(set(flags)), command
        assert len([f for f in flags if f != "--no-amp"]) == len(model.model_fields) + (
            command == "fit"  # --config
        )
    sampling = {"--" + name.replace("_", "-") for name in SamplingSettings.model_fields}
    for command in ("fit", "load", "plan"):
        assert sampling <= set(_flags(command))
    assert {"--json", "--client", "--amp", "--no-amp"} <= set(_flags("load")) | set(_flags("fit"))


def test_fits_defaults_are_those_a_program_gets() -> None:
    s = FitSettings(data="d")
    plain = FitOptions(data="d")
    for name in ("steps", "preset", "workers", "seed", "epoch_size", "out", "clip_grad", "amp"):
        assert getattr(s, name) == getattr(plain, name), name
    assert s.min_live == plain.min_live_fraction


def test_flags_win_over_variables_over_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "fit.toml"
    config.write_text('data = "file.mdio"\nsteps = 10\nseed = 3\nworkers = 0\n')
    monkeypatch.setenv("STRATA_TRAIN_STEPS", "20")
    monkeypatch.setenv("STRATA_TRAIN_SEED", "4")
    given: dict[str, Any] = {"config": config, "seed": 5, "storage_option": ["anon=true"]}
    s = settings(FitSettings, given)
    assert (s.data, s.steps, s.seed, s.workers) == ("file.mdio", 20, 5, 0)
    assert s.storage_option == ("anon=true",)
    monkeypatch.setenv("STRATA_TRAIN_CONFIG", str(config))  # the file, by its variable
    assert settings(FitSettings, {"config": None}).seed == 4
    # plan reads the same variables, so it lists the reads of the run they configure; only
    # fit reads the file
    config.write_text("stepz = 3\n")
    assert settings(PlanSettings, {"data": "d"}).seed == 4


@pytest.mark.parametrize(
    ("args", "variables", "words"),
    [
        (["fit"], {}, "--data is required (the flag or $STRATA_TRAIN_DATA)"),
        (["fit", "--data", "d"], {"STRATA_TRAIN_STEPS": "many"}, "--steps: Input should be"),
        (["plan", "--data", "d"], {"STRATA_TRAIN_EPOCH": "x"}, "--epoch: Input should be"),
        (["fit", "--data", "d", "--config", "{tmp}/absent.toml"], {}, "absent.toml: no such"),
        (["fit", "--data", "d", "--config", "{tmp}/typo.toml"], {}, "stepz: no such setting"),
    ],
)
def test_a_bad_value_is_one_line_and_exit_2(
    args: list[str],
    variables: dict[str, str],
    words: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "typo.toml").write_text("stepz = 3\n")
    for name, value in variables.items():
        monkeypatch.setenv(name, value.format(tmp=tmp_path))
    argv = [a.format(tmp=tmp_path) for a in args]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("strata-train: error: ") and result.stderr.count("\n") == 1
    assert words in result.stderr
