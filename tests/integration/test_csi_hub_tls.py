"""strata-csi's channel to the hub (csi/hubtls.py, csi/hubscope.py) against a real hub that
requires client certificates: the files are checked at start, a renewed certificate is
used without a restart (a half-renewed pair keeps the channel), and each refusal is one
line naming what to fix."""

from __future__ import annotations

import datetime
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from csi.hubscope import HubRefused, HubScope
from csi.hubtls import HubTls, HubTlsError, refusal
from deploy.pki import LocalCa
from hub.serve.config import ServerConfig
from hub.serve.serverthread import ServerThread
from tests.integration.hub_support import (
    Pki,
    pki_fixture,  # noqa: F401  (the pki fixture)
)

TOKENS = '"token-of-demo-0123456789": [demo]\n"token-of-other-0123456789": [other]\n'


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[str]:
    """A hub as shipped: TLS, client certificates of its CA, tokens (no dataset published:
    a token's scope is checked first, and NOT_FOUND is within it)."""
    data = tmp_path_factory.mktemp("hub")
    tokens = data.parent / "csi-tokens.yaml"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    config = ServerConfig(
        tokens=tokens, tls_cert=pki.server.cert, tls_key=pki.server.key, client_ca=pki.ca.pem.cert
    )
    with ServerThread(data, config=config) as server:
        yield f"127.0.0.1:{server.port}"


def _copy(pki: Pki, tmp: Path, who: str) -> HubTls:
    """The plugin's files, copies it may replace: ``who`` is client or foreign_client."""
    pem = getattr(pki, who)
    shutil.copy(pem.cert, tmp / "tls.crt")
    shutil.copy(pem.key, tmp / "tls.key")
    return HubTls(pki.ca.pem.cert, tmp / "tls.crt", tmp / "tls.key", "localhost")


def test_the_spokes_certificate_gets_the_hubs_answer(hub: str, pki: Pki, tmp_path: Path) -> None:
    scope = HubScope(hub, _copy(pki, tmp_path, "client"))
    try:
        assert scope.greet() is None
        assert scope.check("token-of-demo-0123456789", "demo").allowed
        refused = scope.check("token-of-other-0123456789", "demo")
        assert not refused.allowed and "may not read dataset 'demo'" in refused.reason
    finally:
        scope.close()


def test_without_a_client_certificate_the_refusal_says_so(hub: str, pki: Pki) -> None:
    scope = HubScope(hub, HubTls(pki.ca.pem.cert, server_name="localhost"))
    try:
        said = scope.greet()
        assert said is not None and "presents none (give --hub-cert and --hub-key)" in said
        with pytest.raises(HubRefused, match="requires a client certificate") as refused:
            scope.check("token-of-demo-0123456789", "demo")
        assert "\n" not in str(refused.value)
    finally:
        scope.close()


def test_a_renewed_certificate_is_used_without_a_restart(
    hub: str, pki: Pki, tmp_path: Path
) -> None:
    """Started with a foreign certificate (refused); its key replaced first (a half-done
    renewal: the channel stays, still refused), then the certificate: the next call gets
    through on a new channel."""
    tls = _copy(pki, tmp_path, "foreign_client")
    scope = HubScope(hub, tls)
    try:
        with pytest.raises(HubRefused, match="refused this plugin's client certificate"):
            scope.check("token-of-demo-0123456789", "demo")
        shutil.copy(pki.client.key, tmp_path / "tls.key")
        with pytest.raises(HubRefused):
            scope.check("token-of-demo-0123456789", "demo")
        shutil.copy(pki.client.cert, tmp_path / "tls.crt")
        assert scope.check("token-of-demo-0123456789", "demo").allowed
    finally:
        scope.close()


def test_files_are_checked_before_any_call(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(HubTlsError, match="go together"):
        HubTls(pki.ca.pem.cert, cert=pki.client.cert)
    mismatched = HubTls(pki.ca.pem.cert, pki.client.cert, pki.foreign_client.key)
    with pytest.raises(HubTlsError, match="does not match --hub-cert"):
        mismatched.credentials()
    with pytest.raises(HubTlsError, match=r"--hub-ca .* is not a PEM certificate"):
        HubTls(pki.client.key).credentials()
    with pytest.raises(HubTlsError, match=r"--hub-ca .*nope"):
        HubTls(tmp_path / "nope").credentials()
    old = LocalCa(tmp_path, "old-ca").issue("old", expires_in=-datetime.timedelta(days=9))
    with pytest.raises(HubTlsError, match=r"--hub-cert .* expired on"):
        HubTls(pki.ca.pem.cert, old.cert, old.key).credentials()


@pytest.mark.parametrize(
    ("tls", "details", "says"),
    [
        (None, "Socket closed", "speaks TLS and this plugin plaintext (give --hub-ca)"),
        (HubTls(), "Socket closed", "presents none (give --hub-cert and --hub-key)"),
        (
            HubTls(cert=Path("c.crt"), key=Path("c.key")),
            "Socket closed",
            "refused this plugin's client certificate c.crt",
        ),
        (HubTls(), "SSL_ERROR_SSL: CERTIFICATE_VERIFY_FAILED: x", "not trusted by --hub-ca"),
        (HubTls(), "WRONG_VERSION_NUMBER", "does not speak TLS"),
        (HubTls(), "failed to connect to all addresses; Connection refused", None),
    ],
)
def test_refusal_names_what_to_fix(tls: HubTls | None, details: str, says: str | None) -> None:
    said = refusal(tls, details)
    assert said == says if says is None else (said is not None and says in said)
