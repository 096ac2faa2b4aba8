"""Token files and bearer-token authentication."""

from __future__ import annotations

from pathlib import Path

import pytest

from hub.auth.tokens import ANONYMOUS, TokenTable
from hub.errors import ConfigError, PermissionDenied, Unauthenticated

A = "alpha-token-0123456789"
B = "beta-token-9876543210"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("tokens.yaml", f'"{A}": ["f3", "f3-*"]\n"{B}": "*"\n'),
        ("tokens.toml", f'"{A}" = ["f3", "f3-*"]\n"{B}" = "*"\n'),
        ("tokens.json", f'{{"{A}": ["f3", "f3-*"], "{B}": "*"}}'),
    ],
)
def test_token_files(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)
    table = TokenTable.load(tmp_path / name)
    assert len(table) == 2
    alpha = table.authenticate([("authorization", f"Bearer {A}")])
    assert alpha.may_read("f3") and alpha.may_read("f3-small")
    assert not alpha.may_read("f4")
    with pytest.raises(PermissionDenied, match="may not read dataset 'f4'"):
        alpha.require("f4")
    admin = table.authenticate([("authorization", f"bearer {B}")])
    assert admin.may_read("anything")
    assert A not in repr(alpha) and B not in repr(admin), "principals never carry the secret"


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ([], "missing bearer token"),
        ([("x-other", "1")], "missing bearer token"),
        ([("authorization", A)], "expected 'Bearer <token>'"),
        ([("authorization", "Bearer ")], "expected 'Bearer <token>'"),
        ([("authorization", "Bearer nope-nope-nope-nope")], "unknown bearer token"),
        ([("authorization", f"Bearer {A}x")], "unknown bearer token"),
        ([("authorization", f"Bearer {A}"), ("authorization", f"Bearer {B}")], "more than one"),
    ],
)
def test_authentication_failures(metadata: list[tuple[str, str]], message: str) -> None:
    table = TokenTable({A: ("f3",)})
    with pytest.raises(Unauthenticated, match=message):
        table.authenticate(metadata)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected a mapping"),
        ("- a\n- b\n", "expected a mapping"),
        ('"short": "*"\n', "at least 16"),
        (f'"{A}": []\n', "list of dataset globs"),
        (f'"{A}": "f3"\n', "list of dataset globs"),
        (f'"{A}": ["../x"]\n', "is not a valid glob"),
        (f'"{A}": [1]\n', "list of dataset globs"),
        ('"a": [\n', "cannot parse"),
    ],
)
def test_bad_token_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        TokenTable.load(path)


def test_missing_token_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read token file"):
        TokenTable.load(tmp_path / "absent.yaml")


def test_anonymous_reads_everything() -> None:
    assert ANONYMOUS.may_read("f3")
