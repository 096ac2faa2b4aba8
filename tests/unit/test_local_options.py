"""strata_local.options: a settings model's fields become a typer command's flags, and its
values come from flags, then variables, then a TOML file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest
import typer
from pydantic import ByteSize, Field, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from typer.testing import CliRunner

from strata_local.options import (
    ConfigFileError,
    config_parameter,
    declared,
    given,
    help_text,
    load,
    problem,
    with_options,
)

ENV = "STRATA_TEST_CONFIG"


class Toy(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STRATA_TEST_", extra="forbid")

    where: str = Field(description="an address")
    size: ByteSize = Field(default=ByteSize(2**20), description="a size")
    mode: Literal["a", "b"] = Field(default="a", description="a choice")
    count: int = Field(
        default=3, ge=1, description="a count", json_schema_extra={"flag": "--times"}
    )
    quiet: bool = Field(default=False, description="a switch")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        from strata_local.options import config_sources

        return config_sources(settings_cls, init_settings, env_settings, ENV)


OPTIONS = declared(Toy, env_prefix="STRATA_TEST_")


def test_declared_reads_flag_kind_default_and_variable() -> None:
    by_field = {o.field: o for o in OPTIONS}
    assert [o.flag for o in OPTIONS] == ["--where", "--size", "--mode", "--times", "--quiet"]
    assert by_field["size"].kind is str and by_field["mode"].choices == ("a", "b")
    assert by_field["where"].default is None and by_field["count"].default == 3
    assert by_field["count"].name == "times" and by_field["count"].env == "STRATA_TEST_COUNT"
    assert help_text(by_field["size"]) == "a size (default 1MiB; $STRATA_TEST_SIZE)"


def test_flags_win_over_variables_over_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "toy.toml"
    config.write_text('where = "file"\nmode = "b"\ncount = 7\nsize = "4KiB"\n')
    monkeypatch.setenv("STRATA_TEST_COUNT", "5")
    monkeypatch.setenv("STRATA_TEST_WHERE", "env")
    toy = load(Toy, {"where": "flag"}, config, ENV)
    assert (toy.where, toy.count, toy.mode, toy.size) == ("flag", 5, "b", 4096)
    monkeypatch.setenv(ENV, str(config))  # the variable names the file when --config does not
    monkeypatch.delenv("STRATA_TEST_WHERE")
    assert load(Toy, {}, None, ENV).where == "file"


def test_one_line_problems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(ValidationError) as missing:
        load(Toy, {}, None, ENV)
    assert problem(missing.value, OPTIONS, "STRATA_TEST_") == (
        "--where is required (the flag, $STRATA_TEST_WHERE or the config file)"
    )
    with pytest.raises(ValidationError) as small:
        load(Toy, {"where": "x", "count": 0}, None, ENV)
    assert problem(small.value, OPTIONS, "STRATA_TEST_").startswith("--times: Input should be")
    config = tmp_path / "toy.toml"
    config.write_text('where = "x"\ncolour = "red"\n')
    with pytest.raises(ValidationError) as unknown:
        load(Toy, {}, config, ENV)
    assert problem(unknown.value, OPTIONS, "STRATA_TEST_").startswith("colour: no such setting")
    config.write_text("where = \n")
    with pytest.raises(ConfigFileError, match=r"config file .*toy\.toml"):
        load(Toy, {}, config, ENV)
    with pytest.raises(ConfigFileError, match=r"--config .*absent\.toml: no such file"):
        load(Toy, {}, tmp_path / "absent.toml", ENV)
    monkeypatch.setenv(ENV, str(tmp_path / "absent.toml"))
    with pytest.raises(ConfigFileError, match=rf"\${ENV} .*absent.toml: no such file"):
        load(Toy, {"where": "x"}, None, ENV)


def test_with_options_gives_a_typer_command_the_flags() -> None:
    seen: list[Toy] = []
    app = typer.Typer()

    @app.command()
    @with_options(OPTIONS, config_parameter(ENV))
    def toy(**received: Any) -> None:
        seen.append(load(Toy, given(OPTIONS, received), received.pop("config"), ENV))

    result = CliRunner().invoke(app, ["--where", "w", "--times", "2", "--quiet", "--size", "1KiB"])
    assert result.exit_code == 0, result.output
    assert (seen[0].where, seen[0].count, seen[0].quiet, seen[0].size) == ("w", 2, True, 1024)
    assert "$STRATA_TEST_CONFIG" in CliRunner().invoke(app, ["--help"]).output
