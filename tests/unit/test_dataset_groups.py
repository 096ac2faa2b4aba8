"""``--dataset-groups`` (spoke/disk/datasetgroups.py): rules resolved to gids once, at start
(an unknown group is a one-line error and exit 2, from ``strata-spoke run`` and
``strata-mount``), the first matching glob's group for each dataset (root's where none
matches), what the mount shows for a dataset directory, and the succession term.
tests/fuse/test_dataset_groups.py checks the kernel's verdicts on a real mount."""

from __future__ import annotations

import grp
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyfuse3
import pytest
import trio
from pydantic import ValidationError

from fusemount import cli as mount_cli
from fusemount.operations import StrataOperations
from fusemount.reader import BlockReader
from spoke.disk.datasetgroups import DATASET_DIR_MODE, DatasetGroups, resolve, split
from spoke.disk.layout import CacheLayout
from spoke.run import cli, succession
from spoke.run.schema import MountSettings
from spoke.run.settings import CONFIG_ENV, SpokeSettings
from strata_local.options import load
from tests.component.fake_daemon import FakeDaemon

NO_SUCH_GROUP = "strata-no-such-group"
ROOT_GROUP = grp.getgrgid(0).gr_name


def test_rules_resolve_to_gids_in_their_order() -> None:
    assert split(" team-a*=g1, ,team-b=g2 ") == ("team-a*=g1", "team-b=g2")
    assert split("") == ()
    rules = resolve(("team-a*=1001", f"team-*={ROOT_GROUP}", "*=65534"))
    assert rules == ("team-a*=1001", "team-*=0", "*=65534")
    groups = DatasetGroups(rules)
    assert groups.gid("team-a-images") == 1001  # the first match wins
    assert groups.gid("team-b") == 0
    assert groups.gid("other") == 65534
    only_a = DatasetGroups(resolve(["team-a*=1001"]))
    assert only_a.gid("team-b") == 0  # no rule: root's group (deny by default)
    assert only_a and not DatasetGroups(())


@pytest.mark.parametrize(
    ("rule", "said"),
    [
        (f"team-a*={NO_SUCH_GROUP}", f"no group '{NO_SUCH_GROUP}' on this host"),
        ("team-a*", "is not GLOB=GROUP"),
        ("=1001", "is not GLOB=GROUP"),
        ("team-a*=", "is not GLOB=GROUP"),
        (f"team-a*={2**32}", "out of range"),
    ],
)
def test_a_bad_rule_is_refused_naming_the_flag(rule: str, said: str) -> None:
    with pytest.raises(ValueError, match="--dataset-groups: ") as info:
        resolve([rule])
    assert said in str(info.value)


def test_the_settings_hold_gids_from_a_flag_a_variable_or_a_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from_flag = MountSettings(cache_dir=tmp_path, dataset_groups=f"a*={ROOT_GROUP},b=7")
    assert from_flag.dataset_groups == ("a*=0", "b=7")
    from_toml = MountSettings(cache_dir=tmp_path, dataset_groups=[f"a*={ROOT_GROUP}", "b=7"])
    assert from_toml.dataset_groups == from_flag.dataset_groups
    # the mount process validates the file again: gids stay gids
    again = MountSettings.model_validate_json(from_flag.model_dump_json())
    assert again.dataset_groups == from_flag.dataset_groups
    assert MountSettings(cache_dir=tmp_path).dataset_groups == ()  # none: as today
    config = tmp_path / "spoke.toml"
    config.write_text(f'dataset_groups = ["a*={ROOT_GROUP}", "b=7"]\n')
    required = {"hub": "127.0.0.1:1", "cache_dir": tmp_path, "cache_size": "1MiB"}
    from_file = load(SpokeSettings, required, config, CONFIG_ENV)
    assert from_file.dataset_groups == from_flag.dataset_groups
    monkeypatch.setenv("STRATA_SPOKE_DATASET_GROUPS", f"team-*={ROOT_GROUP}")
    spoke = SpokeSettings(hub="127.0.0.1:1", cache_dir=tmp_path, cache_size="1MiB")
    assert spoke.dataset_groups == ("team-*=0",)
    monkeypatch.setenv("STRATA_SPOKE_DATASET_GROUPS", "")  # a unit's empty variable
    spoke = SpokeSettings(hub="127.0.0.1:1", cache_dir=tmp_path, cache_size="1MiB")
    assert spoke.dataset_groups == ()
    with pytest.raises(ValidationError):
        MountSettings(cache_dir=tmp_path, dataset_groups=f"a={NO_SUCH_GROUP}")


def test_an_unknown_group_is_a_one_line_error_of_both_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--hub", "127.0.0.1:1", "--cache-dir", str(tmp_path), "--cache-size", "1MiB"]
    argv += ["--mount", str(tmp_path), "--allow-other"]
    argv += ["--dataset-groups", f"team-a*={ROOT_GROUP},team-b*={NO_SUCH_GROUP}"]
    with pytest.raises(SystemExit) as exit_:
        cli.app(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        f"strata-spoke: error: --dataset-groups: no group '{NO_SUCH_GROUP}' on this host "
        "(GLOB=GROUP: a group name or gid)\n"
    )
    code = mount_cli.main(
        ["--cache-dir", str(tmp_path), "--dataset-groups", f"x={NO_SUCH_GROUP}", str(tmp_path)]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("strata-mount: error: --dataset-groups: no group")
    assert err.count("\n") == 1


def test_successors_must_show_the_same_groups() -> None:
    mnt = Path("/mnt/strata/data")
    mine = succession.terms(mnt, True, ("team-a*=1001",))
    assert succession.refusal(dict(mine), mine) == ""
    for theirs in (succession.terms(mnt, True), succession.terms(mnt, True, ("team-a*=1002",))):
        said = succession.refusal(theirs, mine)
        assert "--dataset-groups differs" in said and "team-a*=1001" in said
    none = succession.terms(mnt, True)
    old_release = {k: v for k, v in none.items() if k != "dataset_groups"}
    assert succession.refusal(old_release, none) == ""  # a successor that knows no groups


CTX: Any = SimpleNamespace(pid=4242, uid=0, gid=0, umask=0)


@pytest.mark.parametrize("rules", [("d*=1234",), ("other=1234",), ()])
def test_the_mount_shows_dataset_directories_owned_by_root_and_the_group(
    tmp_path: Path, rules: tuple[str, ...]
) -> None:
    layout = CacheLayout(tmp_path)
    daemon = FakeDaemon(layout, {})
    ops = StrataOperations(
        daemon,  # type: ignore[arg-type]
        BlockReader(layout, daemon),  # type: ignore[arg-type]
        uid=500,
        gid=500,
        dataset_groups=DatasetGroups(rules),
    )

    async def go() -> None:
        ds = await ops.lookup(pyfuse3.ROOT_INODE, b"ds", CTX)
        v1 = await ops.lookup(ds.st_ino, b"v1", CTX)
        again = await ops.getattr(ds.st_ino, CTX)
        root = await ops.getattr(pyfuse3.ROOT_INODE, CTX)
        shown = (ds.st_mode, ds.st_uid, ds.st_gid)
        assert (again.st_mode, again.st_uid, again.st_gid) == shown
        if not rules:  # as published, owned by the mount's owner
            assert (stat.S_IMODE(ds.st_mode), ds.st_uid, ds.st_gid) == (0o555, 500, 500)
        else:
            gid = 1234 if rules[0].startswith("d*") else 0
            assert shown == (DATASET_DIR_MODE, 0, gid)
        # nothing else changes: the root and what is below a dataset directory
        for attr in (root, v1):
            assert (stat.S_IMODE(attr.st_mode), attr.st_uid, attr.st_gid) == (0o555, 500, 500)

    trio.run(go)
