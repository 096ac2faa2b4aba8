"""The expiry gauges (issue 44 item 7): hub tokens and certificates, spoke certificates, read
from the files at each scrape."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from prometheus_client import CollectorRegistry

from deploy.pki import LocalCa
from hub.auth import tokenstore
from hub.serve.metrics import HubMetrics
from spoke.metrics import CertificateExpiry
from strata_local.expiry import certificate_not_after


def _not_after(pem: Path) -> float:
    return x509.load_pem_x509_certificate(pem.read_bytes()).not_valid_after_utc.timestamp()


def test_the_hub_exposes_each_token_and_its_certificate_expiry(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    now = datetime.datetime(2026, 12, 6, tzinfo=datetime.UTC)
    soon, _ = tokenstore.create(tokens, ["f3"], datetime.timedelta(days=13), now=now)
    tokenstore.create(tokens, ["*"], None, now=now)  # no expiry: no sample
    cert = LocalCa(tmp_path).issue("hub").cert
    metrics = HubMetrics(CollectorRegistry())
    stop = metrics.watch_expiry(tokens, cert)
    registry = metrics.registry
    expiry = registry.get_sample_value("strata_hub_token_expiry_timestamp_seconds", {"token": soon})
    assert expiry == (now + datetime.timedelta(days=13)).timestamp()
    assert registry.get_sample_value("strata_hub_certificate_expiry_timestamp_seconds") == (
        _not_after(cert)
    )
    samples = [
        s
        for m in registry.collect()
        for s in m.samples
        if s.name.endswith("expiry_timestamp_seconds")
    ]
    assert len(samples) == 2  # the token without an expiry is left out
    stop()
    assert registry.get_sample_value("strata_hub_certificate_expiry_timestamp_seconds") is None


def test_the_spoke_reads_its_certificates_again_at_each_scrape(tmp_path: Path) -> None:
    ca = LocalCa(tmp_path)
    leaf = ca.issue("spoke").cert
    collector = CertificateExpiry()
    collector.paths = {"hub-client": leaf, "peer": tmp_path / "missing.pem"}
    (family,) = collector.collect()
    assert [(s.labels, s.value) for s in family.samples] == [
        ({"use": "hub-client"}, _not_after(leaf))
    ]
    leaf.write_text("being replaced")  # read at each scrape: a broken file shows at once
    (family,) = collector.collect()
    assert family.samples == []
    (tmp_path / "next").mkdir()
    renewed = LocalCa(tmp_path / "next").issue("spoke").cert
    leaf.write_bytes(renewed.read_bytes())
    (family,) = collector.collect()
    assert family.samples[0].value == _not_after(renewed)
    assert certificate_not_after(tmp_path / "missing.pem") is None
    (tmp_path / "junk.pem").write_text("not a certificate")
    assert certificate_not_after(tmp_path / "junk.pem") is None
