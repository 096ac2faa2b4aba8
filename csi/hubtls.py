"""How strata-csi reaches the hub: TLS trust, the client certificate, the name to check.

The shipped hub requires client certificates (``strata-hub serve --client-ca``), so the
plugin presents one as the spoke does, with the spoke's flags (``--hub-ca``,
``--hub-cert``/``--hub-key``, ``--hub-server-name``, ``--hub-tls``) and, in the DaemonSet,
the spoke's files. The import rules keep the plugin off the spoke's code
(``spoke.hublink.credentials``), so this is the same checks, small: every file is read
and checked at start (a certificate valid now, the key its own), and read again when one
changes (inode, size, mtime), so a renewed certificate is used without a restart; a
half-renewed pair (certificate replaced, key not yet) keeps the current channel.

:func:`refusal` turns a call that failed in the TLS handshake into one line that says
what to fix. gRPC's client sees only ``Socket closed`` when the hub refuses its client
certificate (or its lack of one), or when it speaks TLS to a plaintext caller: the plugin
knows which of these it did, so the line names the likely cause from its own settings.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

log = logging.getLogger(__name__)

_TLS_WORDS = ("handshake", "ssl", "certificate", "tsi_", "alpn")


class HubTlsError(ValueError):
    """A TLS file is missing, unreadable, malformed, expired or mismatched, or the flags
    do not go together."""


def _read(path: Path, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise HubTlsError(f"{flag} {path}: {err.strerror or err}") from None


def _certificates(data: bytes, path: Path, flag: str) -> list[x509.Certificate]:
    """The PEM certificates in ``data``; the first must be valid now."""
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise HubTlsError(f"{flag} {path} is not a PEM certificate") from None
    now = datetime.datetime.now(datetime.UTC)
    first = certs[0]
    if first.not_valid_after_utc < now:
        expired = f"{first.not_valid_after_utc:%Y-%m-%d %H:%M}"
        raise HubTlsError(f"{flag} {path} expired on {expired} UTC")
    if first.not_valid_before_utc > now:
        raise HubTlsError(
            f"{flag} {path} is not valid before {first.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
        )
    return certs


def _stamp(path: Path | None) -> tuple[int, int, int] | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1, -1)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class HubTls:
    """The plugin's TLS settings for the hub.

    Attributes:
        ca: PEM trust roots for the hub's certificate (None: the system's).
        cert: PEM client certificate chain (mutual TLS); goes with ``key``.
        key: PEM private key of ``cert``, unencrypted.
        server_name: The name the hub's certificate carries, when it is not the host of
            ``--hub`` (SNI and verification).

    Raises:
        HubTlsError: only one of ``cert`` and ``key``.
    """

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise HubTlsError("--hub-cert and --hub-key go together")

    @property
    def mutual(self) -> bool:
        """Whether a client certificate is presented."""
        return self.cert is not None

    def stamp(self) -> tuple[object, ...]:
        """What tells that one of the files changed."""
        return (_stamp(self.ca), _stamp(self.cert), _stamp(self.key))

    def credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials from the files as they are now.

        Raises:
            HubTlsError: a file is missing, malformed or expired, or the key is not the
                certificate's.
        """
        ca = chain = key = None
        if self.ca is not None:
            ca = _read(self.ca, "--hub-ca")
            _certificates(ca, self.ca, "--hub-ca")
        if self.cert is not None and self.key is not None:
            chain = _read(self.cert, "--hub-cert")
            leaf = _certificates(chain, self.cert, "--hub-cert")[0]
            key = _read(self.key, "--hub-key")
            try:
                private = serialization.load_pem_private_key(key, password=None)
            except (ValueError, TypeError):
                raise HubTlsError(
                    f"--hub-key {self.key} is not an unencrypted PEM private key"
                ) from None
            spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            if private.public_key().public_bytes(*spki) != leaf.public_key().public_bytes(*spki):
                raise HubTlsError(f"--hub-key {self.key} does not match --hub-cert {self.cert}")
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=chain
        )

    def options(self) -> list[tuple[str, str]]:
        """Channel options: the name override, when the certificate names another host."""
        if self.server_name is None:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]


def refusal(tls: HubTls | None, details: str) -> str | None:
    """The one-line reason a call that failed UNAVAILABLE with ``details`` was a TLS
    refusal, given what this plugin presented (``tls``; None: plaintext); None when it
    looks like the network (the hub down or unreachable)."""
    lower = details.lower()
    if "certificate_verify_failed" in lower or "certificate verify failed" in lower:
        return (
            "the hub's certificate is not trusted by --hub-ca (or does not name the hub: "
            "--hub-server-name)"
        )
    if "wrong_version_number" in lower or "wrong version number" in lower:
        return "the hub does not speak TLS, or speaks another protocol (check --hub)"
    if "socket closed" in lower:
        if tls is None:
            return (
                "the hub closed the connection: it speaks TLS and this plugin plaintext "
                "(give --hub-ca)"
            )
        if not tls.mutual:
            return (
                "the hub closed the connection at the TLS handshake: it requires a client "
                "certificate and this plugin presents none (give --hub-cert and --hub-key)"
            )
        return (
            "the hub closed the connection at the TLS handshake: it refused this "
            f"plugin's client certificate {tls.cert} (not from the hub's --client-ca?)"
        )
    if any(word in lower for word in _TLS_WORDS):
        return f"TLS with the hub failed: {details.rpartition(': ')[2] or details}"
    return None
