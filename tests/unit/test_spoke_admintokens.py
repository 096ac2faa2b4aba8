"""Scoped admin tokens (spoke.serve.admintokens): hashes only, re-read on change, bad files
refused at load and a broken change keeping the last good table."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from spoke.serve.admintokens import ScopedTokenError, ScopedTokens, parse


def _entry(name: str, token: str, datasets: str) -> str:
    return (
        f"{name}:\n  sha256: {hashlib.sha256(token.encode()).hexdigest()}\n  datasets: {datasets}\n"
    )


def test_a_token_names_its_holder_and_datasets_and_changes_are_picked_up(tmp_path: Path) -> None:
    path = tmp_path / "scoped.yaml"
    path.write_text(_entry("team-a", "secret-a", "[team-a, 'team-a-*']"))
    tokens = ScopedTokens(path)
    caller = tokens.caller("secret-a")
    assert caller is not None and caller.name == "team-a" and not caller.operator
    assert caller.may("team-a-2") and not caller.may("team-b")
    assert tokens.caller("secret-b") is None
    path.write_text(_entry("team-b", "secret-b", "[team-b]") + "x")  # broken: kept
    assert tokens.caller("secret-a") is not None
    path.write_text(_entry("team-b", "secret-b", "[team-b]"))
    assert tokens.caller("secret-a") is None and tokens.caller("secret-b") is not None


@pytest.mark.parametrize(
    "text",
    [
        "team: {sha256: abc, datasets: [x]}",
        "team: {sha256: " + "0" * 64 + ", datasets: []}",
        "team: {sha256: " + "0" * 64 + ", datasets: [x], admin: true}",
        "[a]",
        "a: {sha256: " + "1" * 64 + ", datasets: [x]}\n"
        "b: {sha256: " + "1" * 64 + ", datasets: [y]}",
    ],
    ids=["short-hash", "no-datasets", "unknown-key", "a-list", "one-secret-two-names"],
)
def test_a_bad_file_is_refused(text: str) -> None:
    with pytest.raises(ScopedTokenError):
        parse(text)
