"""Unit tests of how the trainer reads ``--data`` and ``--storage-option`` (trainer.location),
and what a URL means for the hint target and the output-directory check."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.hints import HintTarget
from trainer.location import data_path, is_url, parse_storage_options, url_parts
from trainer.options import FitError, check_out_dir


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("s3://bucket/team/v1/f3.mdio", "s3://bucket/team/v1/f3.mdio"),
        ("gs://bucket/f3.mdio", "gs://bucket/f3.mdio"),
        ("simplecache::s3://bucket/f3.mdio", "simplecache::s3://bucket/f3.mdio"),
        ("a:b://bucket/f3.mdio", Path("a:b:/bucket/f3.mdio")),
        ("file:///data/f3%20a.mdio", Path("/data/f3 a.mdio")),
        ("/mnt/strata/team/v1/f3.mdio", Path("/mnt/strata/team/v1/f3.mdio")),
        ("rel/f3.mdio", Path("rel/f3.mdio")),
        ("s3:/bucket/f3.mdio", Path("s3:/bucket/f3.mdio")),  # one slash: a local path
    ],
)
def test_data_path_keeps_urls_and_makes_everything_else_a_path(
    text: str, expected: str | Path
) -> None:
    got = data_path(text)
    assert got == expected and type(got) is type(expected)
    assert is_url(got) == isinstance(expected, str)


def test_storage_options_parse_json_values_and_keep_strings() -> None:
    options = parse_storage_options(
        [
            "endpoint_url=http://127.0.0.1:8333",
            "anon=true",
            "max_concurrency=16",
            'client_kwargs={"region_name": "eu-west-1"}',
            "anon=false",
            "key=a=b",
        ]
    )
    assert options == {
        "endpoint_url": "http://127.0.0.1:8333",
        "anon": False,
        "max_concurrency": 16,
        "client_kwargs": {"region_name": "eu-west-1"},
        "key": "a=b",
    }
    for bad in ("anon", "=true"):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            parse_storage_options([bad])


def test_hint_names_are_read_off_a_url_as_off_a_mount_path() -> None:
    assert url_parts("s3://bucket/team/v1/f3.mdio").as_posix() == "bucket/team/v1/f3.mdio"
    assert url_parts("simplecache::s3://b/t/v/f3.mdio").as_posix() == "b/t/v/f3.mdio"
    remote = HintTarget.for_path("http://spoke/", "s3://bucket/team/v1/f3.mdio")
    mounted = HintTarget.for_path("http://spoke/", Path("/mnt/strata/team/v1/f3.mdio"))
    assert (remote.dataset, remote.ref, remote.prefix) == ("team", "v1", "f3.mdio")
    assert (mounted.dataset, mounted.ref, mounted.prefix) == ("team", "v1", "f3.mdio")


def test_out_dir_check_is_local_only(tmp_path: Path) -> None:
    check_out_dir("s3://bucket/f3.mdio", tmp_path / "out")  # nothing local to be inside
    with pytest.raises(FitError, match="inside the data path"):
        check_out_dir(tmp_path, tmp_path / "out")
    (tmp_path / "file").write_text("")
    with pytest.raises(FitError, match="not a directory"):
        check_out_dir("s3://bucket/f3.mdio", tmp_path / "file")
