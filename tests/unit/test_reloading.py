"""strata_local.reloading: a settings file re-read when it changes; a change that does not
parse keeps the last good contents, a removed file is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata_local.reloading import ReloadingFile


def _words(text: str, where: str) -> tuple[str, ...]:
    if "!" in text:
        raise ValueError(f"{where}: no '!'")
    return tuple(text.split())


def test_changes_are_read_bad_ones_kept_out_and_a_removed_file_is_absent(tmp_path: Path) -> None:
    path = tmp_path / "words.yaml"
    path.write_text("a b")
    words = ReloadingFile(path, _words, ())
    assert words.current() == ("a", "b")
    path.write_text("a b c")
    assert words.current() == ("a", "b", "c")
    path.write_text("broken!")
    assert words.current() == ("a", "b", "c")
    path.unlink()
    assert words.current() == ()
    path.write_text("d")
    assert words.current() == ("d",)


def test_a_required_file_must_exist_and_parse_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        ReloadingFile(tmp_path / "missing", _words, (), required=True)
    (tmp_path / "bad").write_text("!")
    with pytest.raises(ValueError, match="no '!'"):
        ReloadingFile(tmp_path / "bad", _words, ())


def test_yaml_that_does_not_parse_is_one_line_naming_where() -> None:
    from strata_local.reloading import load_yaml

    with pytest.raises(ValueError) as refused:
        load_yaml("ns: [unclosed\n", "tenancy.yaml", ValueError)
    assert str(refused.value).startswith("tenancy.yaml is not YAML (line 2, column 1): ")
    assert "\n" not in str(refused.value)
