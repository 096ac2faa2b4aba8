"""A throwaway certificate authority for local stacks (benchmarks, tests, the demo's mesh):
one CA and leaf certificates usable both ways (server and client, so one pair serves a
spoke's peer port and is its client certificate towards the others: mTLS), for
``localhost`` and ``127.0.0.1`` by default. ECDSA P-256, valid for a day. For a real
region, make the certificates as ``docs/deploy.md`` says.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ONE_DAY = datetime.timedelta(days=1)
"""How long the CA and (by default) its leaves are valid."""


@dataclass(frozen=True)
class Leaf:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path

    @property
    def cert_bytes(self) -> bytes:
        """The certificate's PEM (what gRPC's credentials take)."""
        return self.cert.read_bytes()

    @property
    def key_bytes(self) -> bytes:
        """The key's PEM."""
        return self.key.read_bytes()


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Leaf:
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return Leaf(cert_path, key_path)


class LocalCa:
    """A CA whose files are ``DIRECTORY/NAME.crt`` and ``.key``.

    Args:
        directory: where the CA's and the leaves' files are written (must exist).
        name: the CA's common name and file stem.
    """

    def __init__(self, directory: Path, name: str = "strata-local-ca") -> None:
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + ONE_DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.pem = _write(directory, name, self._cert, self._key)

    @property
    def cert(self) -> Path:
        """The CA certificate (what ``--peer-ca`` and ``--hub-ca`` take)."""
        return self.pem.cert

    def issue(
        self,
        stem: str,
        dns: tuple[str, ...] = ("localhost",),
        ips: tuple[str, ...] = ("127.0.0.1",),
        *,
        expires_in: datetime.timedelta = ONE_DAY,
    ) -> Leaf:
        """A leaf for server and client use, naming ``dns`` and ``ips``, valid until
        ``expires_in`` from now (negative: one that has expired, for tests of expiry)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        end = now + expires_in
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(stem))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(min(now - datetime.timedelta(minutes=5), end - ONE_DAY))
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return _write(self.directory, stem, cert, key)


def region_flags(directory: Path) -> tuple[str, ...]:
    """The ``--peer-*`` flags securing a local region's mesh the way a real one is: one
    CA, one certificate for every spoke (mTLS on 127.0.0.1) and a region token, made in
    ``directory`` (created if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = LocalCa(directory, "region-ca")
    leaf = ca.issue("spokes")
    token = directory / "peer-token"
    token.write_text(secrets.token_hex(16) + "\n")
    token.chmod(0o600)
    return (
        "--peer-cert",
        str(leaf.cert),
        "--peer-key",
        str(leaf.key),
        "--peer-ca",
        str(ca.cert),
        "--peer-token-file",
        str(token),
    )
