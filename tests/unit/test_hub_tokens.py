"""Managed hub tokens: create prints the secret once and stores a hash, list, revoke,
expiry, reload on change, migration of plain files, and no secret in any error."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest

from hub.auth.tokens import TokenFile, TokenTable
from hub.auth.tokenstore import create, entries, migrate, parse_duration, revoke
from hub.cli.main import main
from hub.errors import ConfigError, NotFound, Unauthenticated

PLAIN = "plain-token-0123456789abcdef"


def auth(secret: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {secret}")]


def test_create_stores_only_a_hash_and_list_revoke(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    token_id, secret = create(path, ["f3", "f3-*"], parse_duration("30d"))
    text = path.read_text()
    assert secret not in text and secret[7:] not in text
    assert os.stat(path).st_mode & 0o777 == 0o600
    table = TokenTable.load(path)
    principal = table.authenticate(auth(secret))
    assert principal.name == token_id and principal.may_read("f3-small")
    assert not principal.may_read("f4")
    (info,) = entries(path)
    assert info.id == token_id and info.datasets == ("f3", "f3-*")
    assert info.expires is not None and info.created is not None
    assert info.expires - info.created == datetime.timedelta(days=30)
    revoke(path, token_id)
    with pytest.raises(Unauthenticated, match="unknown bearer token"):
        TokenTable.load(path).authenticate(auth(secret))
    with pytest.raises(NotFound, match="no token"):
        revoke(path, token_id)


def test_expired_tokens_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)
    token_id, secret = create(path, ["*"], datetime.timedelta(days=1), now=past)
    with pytest.raises(Unauthenticated, match=f"bearer token {token_id} expired at"):
        TokenTable.load(path).authenticate(auth(secret))
    assert entries(path)[0].state(datetime.datetime.now(datetime.UTC)) == "expired"


def test_token_file_reloads_on_change_and_keeps_the_old_table_on_errors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tokens.yaml"
    first_id, first = create(path, ["f3"])
    served = TokenFile(path)
    assert served.authenticate(auth(first)).name == first_id
    _, second = create(path, ["f3"])
    assert served.authenticate(auth(second)).may_read("f3")  # no restart
    revoke(path, first_id)
    with pytest.raises(Unauthenticated):
        served.authenticate(auth(first))
    path.write_text(f"version: 2\ntokens: {{{second}: [\n")  # broken, with a secret in it
    assert served.authenticate(auth(second)).may_read("f3")  # the previous table stays
    assert second not in caplog.text
    assert "keeping the previous tokens" in caplog.text


@pytest.mark.parametrize(
    "text",
    [
        f'"{PLAIN}": ["f3"\n"other": x\n',
        f'"{PLAIN}": [f3]\n  bad indent: {PLAIN}\n',
        f"{PLAIN}: [f3]\n{PLAIN}x: @\n",
    ],
)
def test_yaml_errors_never_echo_a_token(tmp_path: Path, text: str) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        TokenTable.load(path)
    assert PLAIN not in str(caught.value)
    assert "line" in str(caught.value)


def test_migrate_keeps_plain_tokens_working(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(f'"{PLAIN}": ["f3"]\n')
    with pytest.raises(ConfigError, match="token migrate"):
        create(path, ["f3"])
    (token_id,) = migrate(path)
    assert PLAIN not in path.read_text()
    assert TokenTable.load(path).authenticate(auth(PLAIN)).name == token_id
    create(path, ["f4"])
    assert len(entries(path)) == 2


@pytest.mark.parametrize("text", ["", "30", "3x", "-1d", "0d", "1d 2h"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(text)


def test_durations() -> None:
    assert parse_duration("1d12h") == datetime.timedelta(hours=36)
    assert parse_duration("2w") == datetime.timedelta(days=14)


def test_cli_prints_the_secret_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.yaml"
    assert main(["token", "create", "--tokens", str(path), "--dataset", "f3"]) == 0
    out, err = capsys.readouterr()
    secret = out.strip()
    assert secret.startswith("strata_") and "never expires" in err
    assert main(["token", "list", "--tokens", str(path)]) == 0
    out, _ = capsys.readouterr()
    assert secret not in out and "active" in out and "f3" in out
    token_id = out.splitlines()[1].split()[0]
    assert main(["token", "revoke", "--tokens", str(path), token_id]) == 0
    assert main(["token", "revoke", "--tokens", str(path), token_id]) == 2
    assert (
        main(["token", "create", "--tokens", str(path), "--dataset", "f3", "--expires", "x"]) == 2
    )


def test_token_commands_are_audited_without_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    path = tmp_path / "t.yaml"
    assert main(["token", "create", "--tokens", str(path), "--dataset", "f3"]) == 0
    secret = capsys.readouterr().out.strip()
    assert main(["token", "revoke", "--tokens", str(path), "tok-none"]) == 2
    records = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [r["outcome"] for r in records] == ["ok", "error: no token 'tok-none' in " + str(path)]
    assert records[0]["what"].startswith("strata-hub token create --tokens")
    assert records[0]["who"]
    assert secret not in (tmp_path / "audit.jsonl").read_text()


@pytest.mark.parametrize(
    "text",
    [f'"some-token-0123456789": "{PLAIN}"\n', f'"some-token-0123456789": ["{PLAIN}/X"]\n'],
)
def test_a_misplaced_secret_is_not_echoed(tmp_path: Path, text: str) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        TokenTable.load(path)
    assert PLAIN not in str(caught.value) and "some-token" not in str(caught.value)
