"""When credentials run out, for the ``*_expiry_timestamp_seconds`` gauges both the hub and
the spoke export (alerts fire 14 days ahead: ``deploy/prometheus/rules.yml``).

Read at scrape time from the files the processes use, so a renewed certificate shows at
the next scrape with no restart, as the processes themselves pick it up.
"""

from __future__ import annotations

from pathlib import Path

from cryptography import x509


def certificate_not_after(path: Path) -> float | None:
    """The ``notAfter`` of the first certificate in the PEM file ``path``, seconds since the
    epoch (RFC 5280 §4.1.2.5); None when the file is missing or holds no certificate."""
    try:
        pem = path.read_bytes()
    except OSError:
        return None
    try:
        return x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()
    except ValueError:
        return None
