"""Spoke settings (pydantic-settings): command-line flags, ``STRATA_SPOKE_*`` variables, or a
TOML config file (``--config FILE`` / ``STRATA_SPOKE_CONFIG``), in that order of precedence.

The config file holds the same names as the flags, with ``_`` for ``-``::

    # /etc/strata/spoke.toml
    hub = "hub.example.org:7070"
    hub_ca = "/etc/strata/hub-ca.pem"
    hub_cert = "/etc/strata/spoke.pem"
    hub_key = "/etc/strata/spoke.key"
    hub_token_file = "/etc/strata/hub-token"
    encryption_key_file = "/etc/strata/cache.key"
    cache_dir = "/var/cache/strata"
    cache_size = "500GiB"

    [mesh]            # the --peer-* flags, by MeshSettings' names
    listen = "10.0.0.1:7879"

:class:`SpokeSettings` is the one declaration of these options: ``strata-spoke``'s flags are
generated from its fields (:func:`options`, :mod:`spoke.run.schema`), and the children of a
supervisor get them validated, as a file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import ByteSize, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from protocol.address import grpc_target, parse_option_hostport
from spoke.audit import DEFAULT_BACKUPS as DEFAULT_AUDIT_BACKUPS
from spoke.audit import DEFAULT_MAX_BYTES as DEFAULT_AUDIT_MAX_BYTES
from spoke.catalog.signature import PublisherKey, PublisherKeyError
from spoke.disk.layout import CacheLayout
from spoke.hublink.credentials import CredentialError, HubCredentials
from spoke.mesh.settings import MeshSettings
from spoke.run.schema import (
    RUN,
    MountSettings,
    Option,
    declared,
    read_settings,
    resolved,
    settings_file,
    write_settings,
)
from strata_local.options import config_sources

__all__ = [
    "CONFIG_ENV",
    "MountSettings",
    "Option",
    "SpokeSettings",
    "options",
    "read_settings",
    "resolved",
    "settings_file",
    "write_settings",
]

CONFIG_ENV = "STRATA_SPOKE_CONFIG"
"""Variable naming the TOML config file when ``--config`` is not given."""


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(value: str) -> float:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w`` (or a sum such as ``1d12h``) in seconds.

    Raises:
        ValueError: not such a duration, or not positive.
    """
    text = value.strip().lower()
    parts = re.findall(r"(\d+)([smhdw])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"--retention: {value!r} is not a duration such as 12h, 7d or 2w")
    seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"--retention: {value!r} must be positive")
    return float(seconds)


MAX_SOCKET_PATH = 107
"""Longest path of a UNIX socket, bytes (``sun_path`` is 108 bytes with its NUL; unix(7))."""


def default_fetch_workers() -> int:
    """``--fetch-workers``' default: the cores this process may use, at most 8."""
    return max(1, min(8, len(os.sched_getaffinity(0))))


DEFAULT_FETCH_WORKERS = default_fetch_workers()
"""``--fetch-workers``' default on this machine."""


class SpokeSettings(BaseSettings, MountSettings):
    """Everything a spoke daemon and its mount need: the one declaration of every option of
    ``strata-spoke run``/``daemon`` (its flag, ``STRATA_SPOKE_*`` variable, TOML key, default
    and help; :func:`options`). The mesh's options are :class:`MeshSettings`'s, as ``--peer-*``.

    Sizes accept units (``10GiB``, ``512MB``); times are seconds.

    Seventeen methods because each is a field's validator or a derived value (credentials,
    retention, the publisher key) that belongs beside the field it checks; the options
    themselves are fields, not methods.
    """

    model_config = SettingsConfigDict(env_prefix="STRATA_SPOKE_", extra="forbid")

    hub: str = Field(
        description="the hub's HOST:PORT; hub replicas as HOST:PORT,HOST:PORT (IP addresses) "
        "or one DNS name with a record per replica"
    )
    cache_size: ByteSize = Field(description="most bytes of blocks kept on disk, e.g. 10GiB")
    mount: Path | None = Field(
        default=None,
        description="mountpoint of the read-only tree, an existing directory (daemon: the "
        "mount /readyz reports on)",
    )
    admin: str = Field(default="127.0.0.1:7878", description="admin API HOST:PORT (port 0: any)")
    metrics: str | None = Field(
        default=None,
        description="also serve /metrics, /healthz and /readyz, and nothing else (no token), "
        "on HOST:PORT: for Prometheus and probes while --admin stays on 127.0.0.1",
    )
    policy: Literal["arc", "lru", "s3fifo", "sieve"] = Field(
        default="sieve", description="eviction policy: sieve, arc, lru or s3fifo"
    )
    high_watermark: float = Field(
        default=0.95, gt=0, le=1, description="start evicting above this share of --cache-size"
    )
    low_watermark: float = Field(
        default=0.90, gt=0, le=1, description="evict down to this share of --cache-size"
    )
    admin_token_file: Path | None = Field(
        default=None,
        description="file with the admin API's bearer token (default: made at first start, "
        "CACHE_DIR/admin.token)",
    )
    admin_scoped_tokens: Path | None = Field(
        default=None,
        description="YAML of admin tokens scoped to datasets (name: {sha256, datasets}): "
        "their holders prewarm, pin and hint those datasets and see their own jobs, pins "
        "and hints; re-read on change",
    )
    tenants: Path | None = Field(
        default=None,
        description="YAML of tenants (name: {datasets, cache_share, link_share}): no "
        "tenant's fetches evict another's blocks below its cache_share of --cache-size, "
        "nor take more than its link_share of the fetch window while another tenant "
        "misses; per-tenant byte and read metrics; re-read on change",
    )
    background_fill: Literal["auto", "off"] = Field(
        default="auto",
        description="auto: once a snapshot is read, fetch the rest of it at the lowest "
        "priority if it fits in --fill-share of the cache; off: fetch only what is read",
    )
    fill_rate: ByteSize | None = Field(
        default=None, description="most bytes per second the background fill uses, e.g. 50MiB"
    )
    fill_share: float = Field(
        default=0.5, gt=0, le=1, description="fill snapshots that fit in this share of the cache"
    )
    mesh: MeshSettings | None = Field(
        default=None, description="the region's spoke mesh (spoke/mesh/); None: hub only"
    )
    hub_ca: Path | None = Field(
        default=None, description="PEM CA bundle the hub's certificate is from"
    )
    hub_server_name: str | None = Field(
        default=None, description="name in the hub's certificate, if not the --hub host"
    )
    hub_cert: Path | None = Field(default=None, description="PEM client certificate for mutual TLS")
    hub_key: Path | None = Field(default=None, description="PEM private key of --hub-cert")
    hub_token_file: Path | None = Field(
        default=None, description="file with the hub's bearer token"
    )
    hub_tls: bool = Field(default=False, description="TLS to the hub with the system's CA roots")
    hub_insecure: bool = Field(
        default=False, description="allow a hub token without TLS (trusted networks only)"
    )
    hub_bulk_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="the hub's bulk port (strata-hub serve --bulk-port): block bytes come "
        "over it beside gRPC, received by --fetch-workers threads; unset: over gRPC",
    )
    fetch_workers: int = Field(
        default=DEFAULT_FETCH_WORKERS,
        ge=1,
        le=64,
        description="threads receiving blocks on the bulk channel (--hub-bulk-port, "
        "--peer-bulk-port); the default is this machine's cores, at most 8",
    )
    no_admin_token: bool = Field(
        default=False, description="admin API without a token (any local user may use it)"
    )
    retention: str | None = Field(
        default=None, description="evict snapshots nobody read for this long, e.g. 7d"
    )
    audit_log: Path | None = Field(
        default=None, description="JSON-lines audit log (default CACHE_DIR/audit.jsonl)"
    )
    audit_max_bytes: ByteSize = Field(
        default=ByteSize(DEFAULT_AUDIT_MAX_BYTES),
        description="rotate the audit log before it passes this size, e.g. 16MiB",
    )
    audit_backups: int = Field(
        default=DEFAULT_AUDIT_BACKUPS, ge=1, description="rotated audit logs kept (FILE.1 ...)"
    )
    publisher_key: Path | None = Field(
        default=None,
        description="Ed25519 public key (strata-hub keygen): serve only snapshots it signed",
    )

    take_over: bool = Field(
        default=False,
        description="when another strata-spoke run serves this cache dir and mountpoint, "
        "take over its FUSE connection instead of refusing to start (a new release or "
        "pod beside the old one): readers with open files see a stall, not ENOTCONN",
        json_schema_extra={"commands": [RUN]},
    )
    after_succession: Literal["exit", "wait"] = Field(
        default="exit",
        description="once a --take-over spoke serves this one's connection: exit (exit), "
        "or stay idle until SIGTERM (wait: a pod's container, which would be restarted)",
        json_schema_extra={"commands": [RUN]},
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags, then ``STRATA_SPOKE_*`` variables, then the TOML file of ``--config`` or
        ``CONFIG_ENV``."""
        return config_sources(settings_cls, init_settings, env_settings, CONFIG_ENV)

    def hub_credentials(self) -> HubCredentials:
        """The credentials for the hub, loaded now.

        Raises:
            CredentialError: a file is missing, malformed, expired or mismatched.
        """
        return HubCredentials(
            ca=self.hub_ca,
            cert=self.hub_cert,
            key=self.hub_key,
            token_file=self.hub_token_file,
            server_name=self.hub_server_name,
            tls=self.hub_tls,
        )

    @field_validator("retention")
    @classmethod
    def _retention(cls, v: str | None) -> str | None:
        if v is not None:
            parse_duration(v)
        return v

    def retention_seconds(self) -> float | None:
        """``retention`` in seconds (None: keep blocks until evicted for room)."""
        return parse_duration(self.retention) if self.retention is not None else None

    @model_validator(mode="after")
    def _hub_credentials(self) -> SpokeSettings:
        try:
            creds = self.hub_credentials()
        except CredentialError as err:
            raise ValueError(str(err)) from None
        if creds.token_file is not None and not creds.tls and not self.hub_insecure:
            raise ValueError(
                "--hub-token-file without TLS would send the token in cleartext: add "
                "--hub-ca (or --hub-tls), or --hub-insecure on a trusted network"
            )
        grpc_ports = {part.rpartition(":")[2] for part in self.hub.split(",")}
        if self.hub_bulk_port is not None and str(self.hub_bulk_port) in grpc_ports:
            raise ValueError(
                f"--hub-bulk-port {self.hub_bulk_port} is the hub's gRPC port (--hub "
                f"{self.hub}): give the port of the hub's serve --bulk-port"
            )
        return self

    @field_validator("hub")
    @classmethod
    def _hub(cls, v: str) -> str:
        grpc_target(v, "--hub")
        return v

    @field_validator("admin")
    @classmethod
    def _admin(cls, v: str) -> str:
        parse_option_hostport(v, "--admin")
        return v

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, v: str | None) -> str | None:
        if v is not None:
            parse_option_hostport(v, "--metrics")
        return v

    @field_validator("admin_token_file")
    @classmethod
    def _token(cls, v: Path | None) -> Path | None:
        if v is not None and not (v.is_file() and v.read_text().strip()):
            raise ValueError(f"--admin-token-file {v} is missing or empty")
        return v

    @field_validator("admin_scoped_tokens")
    @classmethod
    def _scoped(cls, v: Path | None) -> Path | None:
        if v is not None:
            from spoke.serve.admintokens import ScopedTokens

            ScopedTokens(v)  # raises ScopedTokenError (a ValueError) naming what is wrong
        return v

    @field_validator("tenants")
    @classmethod
    def _tenants(cls, v: Path | None) -> Path | None:
        if v is not None:
            from spoke.cache.tenants import TenantShares

            TenantShares(v, 1)  # raises TenantsError (a ValueError) naming what is wrong
        return v

    @field_validator("publisher_key")
    @classmethod
    def _publisher_key(cls, v: Path | None) -> Path | None:
        if v is not None:
            try:
                PublisherKey.from_file(v)
            except PublisherKeyError as err:
                raise ValueError(str(err)) from None
        return v

    def publisher(self) -> PublisherKey | None:
        """The publisher key of ``--publisher-key`` (None: signatures are not checked).

        Raises:
            PublisherKeyError: the file is missing, unreadable or not an Ed25519 key.
        """
        return PublisherKey.from_file(self.publisher_key) if self.publisher_key else None

    @field_validator("cache_dir")
    @classmethod
    def _cache_dir(cls, v: Path) -> Path:
        socket = str(CacheLayout(v.resolve()).socket_path)
        if len(socket.encode()) > MAX_SOCKET_PATH:
            raise ValueError(
                f"--cache-dir {v} is too long: the daemon's socket {socket} would have "
                f"{len(socket.encode())} bytes, UNIX sockets allow {MAX_SOCKET_PATH}; "
                "use a shorter path"
            )
        return v

    @field_validator("cache_size")
    @classmethod
    def _size(cls, v: ByteSize) -> ByteSize:
        if v <= 0:
            raise ValueError("--cache-size must be positive")
        return v

    @field_validator("audit_max_bytes")
    @classmethod
    def _audit_size(cls, v: ByteSize) -> ByteSize:
        if v < 1024:
            raise ValueError("--audit-max-bytes must be at least 1 KiB")
        return v

    @field_validator("fill_rate")
    @classmethod
    def _fill_rate(cls, v: ByteSize | None) -> ByteSize | None:
        if v is not None and v <= 0:
            raise ValueError("--fill-rate must be a positive size per second, e.g. 50MiB")
        return v


def options() -> tuple[Option, ...]:
    """Every option of ``strata-spoke run`` and ``daemon``, in declaration order: the
    settings' own, then the mesh's (``--peer-*``)."""
    prefix = SpokeSettings.model_config.get("env_prefix")
    own = [name for name in SpokeSettings.model_fields if name != "mesh"]
    return declared(SpokeSettings, own, prefix) + declared(MeshSettings, mesh=True)
