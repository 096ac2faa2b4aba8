"""Publisher signatures: keygen, a signed publish stored and served with its snapshot, and
the spoke's check of it (unsigned, another key, another name: refused)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hub.auth.signing import SigningKeyError, keygen, load_signer
from hub.catalog import Catalog
from hub.cli.main import main as hub_main
from hub.publish.tree import publish
from hub.serve.wire import snapshot_message
from hub.store.datadir import DataDir
from spoke.catalog.signature import PublisherKey, PublisherKeyError


def _tree(root: Path) -> Path:
    root.mkdir()
    (root / "a.bin").write_bytes(b"signed bytes")
    return root


def test_a_signed_publish_verifies_with_the_public_key_only(tmp_path: Path) -> None:
    keygen(tmp_path / "pub.key", tmp_path / "pub.pem")
    keygen(tmp_path / "other.key", tmp_path / "other.pem")
    assert oct((tmp_path / "pub.key").stat().st_mode & 0o777) == "0o600"
    data = tmp_path / "data"
    publish(data, "ds", _tree(tmp_path / "src"), signing_key=tmp_path / "pub.key")
    publish(data, "ds", tmp_path / "src")  # v2 unsigned
    with Catalog(DataDir.open(data, create=False).catalog_path, create=False) as catalog:
        v1, v2 = catalog.resolve("ds", "v1"), catalog.resolve("ds", "v2")
    assert len(v1.signature) == 64 and v2.signature == b""
    key = PublisherKey.from_file(tmp_path / "pub.pem")
    signed = snapshot_message(v1)
    assert signed.signature == v1.signature
    assert key.problem(signed) is None
    assert key.problem(snapshot_message(v2)) == "it is not signed"
    other = PublisherKey.from_file(tmp_path / "other.pem")
    assert other.problem(signed) == "its signature does not verify with the publisher key"
    for change in ({"version": "v2"}, {"dataset": "ds2"}, {"snapshot_id": "0" * 32}):
        moved = snapshot_message(v1)
        for field, value in change.items():
            setattr(moved, field, value)
        assert key.problem(moved) is not None, change  # a signature binds name and content


def test_bad_keys_say_why(tmp_path: Path) -> None:
    keygen(tmp_path / "k", tmp_path / "k.pem")
    with pytest.raises(SigningKeyError, match="exists: keys are never overwritten"):
        keygen(tmp_path / "k", tmp_path / "new.pem")
    (tmp_path / "k").chmod(0o644)
    with pytest.raises(SigningKeyError, match=r"readable by group or others \(mode 0644\)"):
        load_signer(tmp_path / "k")
    with pytest.raises(SigningKeyError, match="No such file"):
        load_signer(tmp_path / "missing")
    with pytest.raises(SigningKeyError, match="not an unencrypted PEM private key"):
        (tmp_path / "junk").write_bytes(b"junk")
        (tmp_path / "junk").chmod(0o600)
        load_signer(tmp_path / "junk")
    with pytest.raises(PublisherKeyError, match="not a PEM public key"):
        PublisherKey.from_file(tmp_path / "junk")
    with pytest.raises(PublisherKeyError, match="No such file"):
        PublisherKey.from_file(tmp_path / "missing.pem")


def test_cli_keygen_and_signed_publish(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    private, public = tmp_path / "p.key", tmp_path / "p.pem"
    assert hub_main(["keygen", str(private), str(public)]) == 0
    data = str(tmp_path / "data")
    src = str(_tree(tmp_path / "src"))
    assert hub_main(["publish", "--data-dir", data, "ds", src, "--signing-key", str(private)]) == 0
    assert hub_main(["publish", "--data-dir", data, "ds", src, "--signing-key", str(public)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"strata-hub: error: --signing-key {public}: ")
    with Catalog(DataDir.open(data, create=False).catalog_path, create=False) as catalog:
        snap = catalog.resolve("ds", "latest")
    assert snap.version == "v1"  # the refused publish published nothing
    assert PublisherKey.from_file(public).problem(snapshot_message(snap)) is None
