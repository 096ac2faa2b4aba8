"""One schema declares every option of the spoke: the command lines offer each of them once,
and the children a supervisor starts get the validated settings as an owner-only file."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from spoke.mesh.settings import MeshSettings
from spoke.run import cli
from spoke.run.schema import MountSettings, read_settings, write_settings
from spoke.run.settings import SpokeSettings, options


def _flags(command: str) -> list[str]:
    group = typer.main.get_group(cli.app)
    params = group.commands[command].params
    return [opt for p in params for opt in p.opts if opt.startswith("--")]


def test_every_setting_has_exactly_one_flag_on_run_and_the_daemon() -> None:
    fields = [f for f in SpokeSettings.model_fields if f != "mesh"] + list(
        MeshSettings.model_fields
    )
    declared = options()
    assert sorted(o.field for o in declared) == sorted(fields)  # nothing without a flag
    run, daemon = _flags("run"), _flags("daemon")
    assert len(run) == len(set(run)) and len(daemon) == len(set(daemon))
    assert set(run) == {o.flag for o in declared} | {"--config"}
    mount_only = {
        "--allow-other",
        "--read-ahead-kb",
        "--passthrough",
        "--mount-handover",
        "--mount-workers",
        "--readable-by-all",
        "--mount-uid",
        "--mount-gid",
        "--dataset-groups",
        "--take-over",  # the supervisor's: succession
        "--after-succession",
    }
    assert set(daemon) == {o.flag for o in declared} - mount_only | {"--config", "--settings"}
    for flag in ("--high-watermark", "--low-watermark", "--fill-share", "--peer-probe-interval"):
        assert flag in run


def test_the_flags_reach_the_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[SpokeSettings] = []

    class Supervisor:
        def __init__(self, settings: SpokeSettings) -> None:
            seen.append(settings)

        def run(self) -> int:
            return 0

    monkeypatch.setattr(cli, "Supervisor", Supervisor)
    argv = ["run", "--hub", "127.0.0.1:1", "--cache-dir", str(tmp_path), "--cache-size", "1MiB"]
    argv += ["--high-watermark", "0.8", "--low-watermark", "0.7", "--fill-share", "0.25"]
    argv += ["--peer-listen", "127.0.0.1:1", "--peers", "a:1,b:2", "--peer-insecure"]
    argv += ["--peer-probe-interval", "5", "--log-level", "warning"]
    with pytest.raises(SystemExit) as exit_:
        cli.app(argv)
    assert exit_.value.code == 0
    (settings,) = seen
    assert (settings.high_watermark, settings.low_watermark, settings.fill_share) == (
        0.8, 0.7, 0.25,
    )  # fmt: skip
    assert settings.mesh is not None and settings.mesh.peers == ("a:1", "b:2")
    assert settings.mesh.probe_interval == 5.0 and settings.log_level == "WARNING"


def test_children_get_the_settings_as_an_owner_only_file(tmp_path: Path) -> None:
    from spoke.run.supervisor import Supervisor

    (tmp_path / "mnt").mkdir()
    settings = SpokeSettings(
        hub="127.0.0.1:1",
        cache_dir=tmp_path / "c",
        cache_size="1MiB",  # type: ignore[arg-type]
        mount=tmp_path / "mnt",
        high_watermark=0.8,
        fill_share=0.25,
        read_ahead_kb=64,
    )
    supervisor = Supervisor(settings)
    private = supervisor.layout.private_dir
    private.mkdir(parents=True)
    daemon = supervisor._daemon_cmd()
    assert daemon[1:] == ["-m", "spoke", "daemon", "--settings", daemon[-1]]  # no other flags
    assert write_settings(supervisor.settings, private, "daemon") == Path(daemon[-1])
    assert stat.S_IMODE(Path(daemon[-1]).stat().st_mode) == 0o600
    handed = read_settings(SpokeSettings, Path(daemon[-1]))
    assert handed == supervisor.settings and handed.fill_share == 0.25
    assert handed.cache_dir == (tmp_path / "c").resolve() and handed.mount == tmp_path / "mnt"
    mount = supervisor._mount_cmd()
    assert mount[-1] == str(tmp_path / "mnt") and mount[-3] == "--settings"
    write_settings(supervisor.mount_settings(), private, "mount")
    assert read_settings(MountSettings, Path(mount[-2])).read_ahead_kb == 64
    # other settings: another file name (the child is not adopted), the old file removed
    other = Supervisor(settings.model_copy(update={"high_watermark": 0.9}))
    assert other._daemon_cmd() != daemon
    write_settings(other.settings, private, "daemon")
    assert not Path(daemon[-1]).exists()


def test_a_daemon_given_settings_takes_no_other_flags(tmp_path: Path) -> None:
    settings = SpokeSettings(hub="127.0.0.1:1", cache_dir=tmp_path, cache_size="1MiB")  # type: ignore[arg-type]
    path = write_settings(settings, tmp_path, "daemon")
    proc = subprocess.run(
        [sys.executable, "-m", "spoke", "daemon", "--settings", str(path), "--policy", "lru"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "strata-spoke: error: --settings takes no other settings: --policy"
    )


def test_the_mount_takes_its_defaults_from_the_schema(tmp_path: Path) -> None:
    from fusemount import cli as mount_cli

    ns = mount_cli._parser().parse_args(["--cache-dir", str(tmp_path), str(tmp_path)])
    settings = mount_cli._settings(ns)
    assert settings == MountSettings(cache_dir=tmp_path)
    assert isinstance(settings, MountSettings)
    assert settings.read_ahead_kb == MountSettings.model_fields["read_ahead_kb"].default
    missing = mount_cli._parser().parse_args([str(tmp_path)])
    assert mount_cli._settings(missing) == "--cache-dir is required"
    path = write_settings(MountSettings(cache_dir=tmp_path, miss_deadline=5), tmp_path, "mount")
    from_file = mount_cli._parser().parse_args(["--settings", str(path), str(tmp_path)])
    assert mount_cli._settings(from_file) == MountSettings(cache_dir=tmp_path, miss_deadline=5)
