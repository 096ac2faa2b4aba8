"""``strata-hub serve``'s one settings schema: each option is a flag, a ``STRATA_HUB_*``
variable and a TOML key, flags winning over variables over the file; a bad value from any of
them is one line and exit code 2, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer.main

from hub.cli import main as cli
from hub.cli.settings import SERVE_OPTIONS, HubServeSettings
from hub.serve.config import ServerConfig


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[HubServeSettings]:
    """The settings ``serve`` would start a server with (none is started)."""
    seen: list[HubServeSettings] = []

    async def _serve(settings: HubServeSettings) -> None:
        seen.append(settings)

    monkeypatch.setattr(cli, "_serve", _serve)
    for option in SERVE_OPTIONS:
        monkeypatch.delenv(str(option.env), raising=False)
    monkeypatch.delenv("STRATA_HUB_CONFIG", raising=False)
    return seen


def one_line_error(capsys: pytest.CaptureFixture[str], fragment: str) -> None:
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("strata-hub: error: "), err
    assert fragment in err[0], err[0]


def test_every_setting_is_one_flag_and_the_defaults_are_the_servers() -> None:
    params = typer.main.get_command(cli.app).commands["serve"].params  # type: ignore[attr-defined]
    flags = [opt for p in params for opt in p.opts]
    assert len(flags) == len(set(flags))
    assert set(flags) == {o.flag for o in SERVE_OPTIONS} | {"--config"}
    for flag in ("--data-dir", "--listen", "--max-bytes-per-token", "--bulk-port", "--catalog"):
        assert flag in flags  # the names deploy/ and docs/ use
    plain = HubServeSettings(data_dir=Path("d"), listen="127.0.0.1:0")
    assert plain.server_config() == ServerConfig()


def test_flags_win_over_variables_over_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: list[HubServeSettings]
) -> None:
    config = tmp_path / "hub.toml"
    config.write_text(
        f'data_dir = "{tmp_path}"\nlisten = "127.0.0.1:1"\nmax_connections = 100\n'
        "grace = 1.5\nbulk_port = 7\ninsecure = true\n"
    )
    monkeypatch.setenv("STRATA_HUB_MAX_CONNECTIONS", "200")
    monkeypatch.setenv("STRATA_HUB_LISTEN", "127.0.0.1:2")
    assert cli.main(["serve", "--config", str(config), "--max-connections", "300"]) == 0
    monkeypatch.setenv("STRATA_HUB_CONFIG", str(config))  # the file, by its variable
    assert cli.main(["serve"]) == 0
    first, second = served
    assert (first.max_connections, first.listen, first.grace) == (300, "127.0.0.1:2", 1.5)
    assert (second.max_connections, second.data_dir, second.insecure) == (200, tmp_path, True)
    assert second.server_config().bulk_port == 7


@pytest.mark.parametrize(
    ("where", "value", "fragment"),
    [
        ("env", "lots", "--max-connections: Input should be a valid integer"),
        ("toml", "0", "--max-connections 0 is not at least 1"),  # the server's own check
        ("flag", "0", "--max-connections 0 is not at least 1"),
        ("flag", "lots", "Invalid value for '--max-connections'"),
    ],
)
def test_a_bad_value_is_one_line_and_exit_2(
    where: str,
    value: str,
    fragment: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    served: list[HubServeSettings],
) -> None:
    argv = ["serve", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0"]
    if where == "env":
        monkeypatch.setenv("STRATA_HUB_MAX_CONNECTIONS", value)
    elif where == "toml":
        (tmp_path / "hub.toml").write_text(f"max_connections = {value}\n")
        argv += ["--config", str(tmp_path / "hub.toml")]
    else:
        argv += ["--max-connections", value]
    assert cli.main(argv) == 2
    one_line_error(capsys, fragment)
    assert served == []


def test_the_config_file_is_refused_when_unknown_missing_or_malformed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], served: list[HubServeSettings]
) -> None:
    config = tmp_path / "hub.toml"
    argv = ["serve", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0", "--config"]
    config.write_text("max_conections = 10\n")  # a typo is not silently a default
    assert cli.main([*argv, str(config)]) == 2
    one_line_error(capsys, "max_conections: no such setting")
    config.write_text("max_connections = \n")
    assert cli.main([*argv, str(config)]) == 2
    one_line_error(capsys, f"config file {config}")
    assert cli.main([*argv, str(tmp_path / "absent.toml")]) == 2
    one_line_error(capsys, "absent.toml: no such file")
    assert served == []


def test_a_required_option_names_its_flag_and_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], served: list[HubServeSettings]
) -> None:
    assert cli.main(["serve", "--listen", "127.0.0.1:0"]) == 2
    one_line_error(capsys, "--data-dir is required (the flag, $STRATA_HUB_DATA_DIR")
    assert cli.main(["serve", "--data-dir", str(tmp_path), "--bulk-port-file", "p"]) == 2
    one_line_error(capsys, "--listen is required")
