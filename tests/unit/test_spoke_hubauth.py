"""Spoke → hub credential settings: one-line errors for unusable files, no token in
cleartext, a TOML config file, and re-reading a changed token file."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from deploy.pki import LocalCa
from spoke.hublink.credentials import HubCredentials
from spoke.run.cli import app
from spoke.run.settings import (
    CONFIG_ENV,
    SpokeSettings,
    read_settings,
    resolved,
    write_settings,
)


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["run", *args])
    return result.exit_code, result.output


BASE = ("--hub", "127.0.0.1:1", "--cache-size", "1MiB")


def test_unusable_credentials_are_one_line_errors(tmp_path: Path) -> None:
    ca = LocalCa(tmp_path, "ca")
    other = ca.issue("other")
    mine = ca.issue("mine")
    expired = LocalCa(tmp_path, "old-ca").issue("old", expires_in=-datetime.timedelta(days=1))
    cert, key = expired.cert, expired.key
    token = tmp_path / "token"
    token.write_text("a-token-0123456789\n")
    common = (*BASE, "--cache-dir", str(tmp_path / "c"), "--mount", str(tmp_path))
    cases = [
        (("--hub-ca", str(tmp_path / "absent.pem")), "--hub-ca"),
        (("--hub-ca", str(token)), "is not a PEM certificate"),
        (
            ("--hub-ca", str(ca.pem.cert), "--hub-cert", str(cert), "--hub-key", str(key)),
            "expired on",
        ),
        (("--hub-cert", str(mine.cert), "--hub-key", str(other.key)), "does not match"),
        (("--hub-cert", str(mine.cert)), "go together"),
        (("--hub-token-file", str(token)), "cleartext"),
        (("--hub-server-name", "hub"), "needs TLS"),
    ]
    for extra, message in cases:
        code, output = run(*common, *extra)
        assert code == 2, (extra, output)
        assert message in output, (extra, output)
        assert len(output.strip().splitlines()) == 1, output
        assert "a-token-0123456789" not in output


def test_config_file_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = LocalCa(tmp_path, "ca")
    token = tmp_path / "token"
    token.write_text("first-token-0123456789\n")
    config = tmp_path / "spoke.toml"
    config.write_text(
        f'hub = "hub.example:7070"\ncache_dir = "{tmp_path / "c"}"\ncache_size = "2GiB"\n'
        f'hub_ca = "{ca.pem.cert}"\nhub_token_file = "{token}"\npolicy = "lru"\n'
    )
    monkeypatch.setenv(CONFIG_ENV, str(config))
    monkeypatch.setenv("STRATA_SPOKE_POLICY", "arc")
    settings = SpokeSettings(cache_size="4GiB")  # type: ignore[arg-type]
    assert settings.hub == "hub.example:7070"
    assert int(settings.cache_size) == 4 << 30  # flags win
    assert settings.policy == "arc"  # then variables, then the file
    handed = read_settings(SpokeSettings, write_settings(resolved(settings), tmp_path, "daemon"))
    assert handed.hub_token_file == token.resolve()  # what a child daemon is given
    creds = settings.hub_credentials()
    assert creds.tls and creds.metadata() == (("authorization", "Bearer first-token-0123456789"),)
    token.write_text("second-token-0123456789\n")
    assert creds.metadata() == (("authorization", "Bearer second-token-0123456789"),)
    token.write_text("")  # half-written: keep the previous token
    assert creds.metadata() == (("authorization", "Bearer second-token-0123456789"),)


def test_renewed_certificate_is_picked_up_once_consistent(tmp_path: Path) -> None:
    ca = LocalCa(tmp_path, "ca")
    first, second = ca.issue("one"), ca.issue("two")
    cert, key = tmp_path / "c.crt", tmp_path / "c.key"
    cert.write_bytes(first.cert_bytes)
    key.write_bytes(first.key_bytes)
    creds = HubCredentials(ca=ca.pem.cert, cert=cert, key=key)
    assert creds.refresh_tls() is None
    cert.write_bytes(second.cert_bytes)  # the key not yet
    assert creds.refresh_tls() is None
    key.write_bytes(second.key_bytes)
    material = creds.refresh_tls()
    assert material is not None and material.chain == second.cert_bytes
    assert creds.refresh_tls() is None
