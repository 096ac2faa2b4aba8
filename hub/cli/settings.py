"""``strata-hub serve``'s settings: command-line flags, ``STRATA_HUB_*`` variables, or a TOML
config file (``--config FILE`` / ``STRATA_HUB_CONFIG``), in that order of precedence.

The config file holds the same names as the flags, with ``_`` for ``-``::

    # /etc/strata/hub.toml
    data_dir = "/var/lib/strata-hub"
    listen = "0.0.0.0:50051"
    bulk_port = 50052
    metrics = "0.0.0.0:9464"
    tls_cert = "/etc/strata/hub.pem"
    tls_key = "/etc/strata/hub.key"
    client_ca = "/etc/strata/spokes-ca.pem"
    tokens = "/etc/strata/hub-tokens.yaml"
    max_connections = 4096

:class:`HubServeSettings` is the one declaration of these options: ``serve``'s flags are
generated from its fields (:data:`SERVE_OPTIONS`, :mod:`strata_local.options`), as the
spoke's are from ``SpokeSettings``. A value out of range is refused before anything
starts, with the one-line error the server itself would give (:meth:`ServerConfig.validate`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from hub.audit import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES
from hub.auth.grants import DEFAULT_LIFETIME_S, HOLDERS_PER_TOKEN
from hub.cli.options import BLOBS_HELP, CATALOG_HELP, DATA_DIR_HELP, S3_ENDPOINT_HELP
from hub.errors import ConfigError
from hub.limits.budget import (
    BYTES_PER_TOKEN,
    STALL_S,
    STREAMS,
    STREAMS_PER_TOKEN,
    TOTAL_BYTES,
    WAIT_S,
)
from hub.limits.sizes import HANDSHAKE_TIMEOUT_S, MAX_CONNECTIONS
from hub.limits.streams import MANIFEST_STREAMS, WATCH_STREAMS
from hub.serve.bulk import MAX_CONNECTIONS as BULK_CONNECTIONS
from hub.serve.config import MAX_MESSAGE_BYTES, ServerConfig
from hub.serve.server import GRACE_SECONDS
from strata_local.options import ConfigFileError, config_sources, declared, given, load, problem

ENV_PREFIX = "STRATA_HUB_"
CONFIG_ENV = "STRATA_HUB_CONFIG"
"""Variable naming the TOML config file when ``--config`` is not given."""


class HubServeSettings(BaseSettings):
    """Everything ``strata-hub serve`` takes: the one declaration of each of its options (its
    flag, ``STRATA_HUB_*`` variable, TOML key, default and help). Sizes are bytes, times
    seconds."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    data_dir: Path = Field(description=DATA_DIR_HELP)
    listen: str = Field(description="gRPC address HOST:PORT; port 0 picks a free port.")
    metrics: str | None = Field(default=None, description="Serve Prometheus metrics on HOST:PORT.")
    port_file: Path | None = Field(
        default=None,
        description="Write the bound gRPC port to this file, last (once it exists, every "
        "port serves and --bulk-port-file is written).",
    )
    tls_cert: Path | None = Field(
        default=None, description="Serve TLS with this PEM certificate chain."
    )
    tls_key: Path | None = Field(default=None, description="PEM private key of --tls-cert.")
    client_ca: Path | None = Field(
        default=None, description="Require client certificates signed by this PEM CA (mTLS)."
    )
    tokens: Path | None = Field(
        default=None,
        description="Require bearer tokens: a YAML/TOML/JSON file mapping token -> dataset "
        'globs (or "*").',
    )
    insecure: bool = Field(
        default=False,
        description="Allow --tokens and read grants without TLS (they travel in cleartext).",
    )
    max_message_bytes: int = Field(
        default=MAX_MESSAGE_BYTES,
        description="Largest gRPC message sent (requests have their own limit, 32 KiB).",
    )
    max_connections: int = Field(
        default=MAX_CONNECTIONS,
        description="Most client connections open at once; more are closed as they arrive "
        "(about 45 KiB each while a TLS handshake is pending).",
    )
    handshake_timeout: float = Field(
        default=HANDSHAKE_TIMEOUT_S,
        description="Seconds a connection may take to finish its TLS handshake and send its "
        "HTTP/2 settings before it is closed.",
    )
    max_streams_per_token: int = Field(
        default=STREAMS_PER_TOKEN,
        description="Most ReadBlocks streams one token may have open; more are refused "
        "(RESOURCE_EXHAUSTED). A spoke opens up to 16.",
    )
    max_block_streams: int = Field(
        default=STREAMS,
        description="Most ReadBlocks streams open at once over every token; more are refused "
        "(RESOURCE_EXHAUSTED).",
    )
    max_bytes_per_token: int = Field(
        default=BYTES_PER_TOKEN,
        description="Most bytes the hub holds for one token's ReadBlocks streams (blocks "
        "unread by the client) and requests still arriving; a stream waits for room, up to "
        "--budget-wait.",
    )
    max_bytes_in_flight: int = Field(
        default=TOTAL_BYTES,
        description="Most bytes the hub holds for every token's streams and requests together.",
    )
    budget_wait: float = Field(
        default=WAIT_S,
        description="Seconds a ReadBlocks stream waits for room in the byte budget before it "
        "is refused (RESOURCE_EXHAUSTED).",
    )
    stall_timeout: float = Field(
        default=STALL_S,
        description="Seconds one MiB of a block's bytes (a ReadBlocks message, a bulk channel "
        "step) may take to leave; a smaller message gets its share, at least 2 s (a stream's "
        "first messages are 64 KiB). Then the stream is ended (RESOURCE_EXHAUSTED; a bulk "
        "connection is closed) and its share of the byte budget given back. A slow reader "
        "that keeps reading is not cut.",
    )
    max_manifest_streams: int = Field(
        default=MANIFEST_STREAMS,
        description="Most GetManifest streams open at once, one token at most an eighth; a "
        "stream waits for a slot up to --budget-wait, then is refused.",
    )
    max_watch_streams: int = Field(
        default=WATCH_STREAMS,
        description="Most Watch streams open at once (a spoke holds one), one token at most "
        "an eighth; more are refused (RESOURCE_EXHAUSTED).",
    )
    grant_holders_per_token: int = Field(
        default=HOLDERS_PER_TOKEN,
        description="Most holder keys (spokes) one token may hold live read grants for; a "
        "region whose nodes share one token needs about twice its node count.",
    )
    grace: float = Field(
        default=GRACE_SECONDS, description="Seconds calls in flight get to finish on shutdown."
    )
    blobs: str | None = Field(default=None, description=BLOBS_HELP)
    s3_endpoint: str | None = Field(default=None, description=S3_ENDPOINT_HELP)
    grant_key: Path | None = Field(
        default=None,
        description="Ed25519 key (PEM, strata-hub keygen) that signs the spokes' read grants "
        "for the regional mesh (default: DATA_DIR/grant.key, made at first start).",
    )
    grant_lifetime: float = Field(
        default=DEFAULT_LIFETIME_S,
        description="Seconds a read grant is valid (1 to 300): how long a narrowed or revoked "
        "token may still be used at the spokes' peers.",
    )
    rotate_grant_key: bool = Field(
        default=False,
        description="With --catalog: make this replica's --grant-key the one every replica "
        "signs with (replicas refuse to start with another key than the recorded one).",
    )
    audit_log: Path | None = Field(
        default=None,
        description="JSON-lines audit file (default DATA_DIR/audit.jsonl); rotated files "
        "FILE.1 ... go beside it.",
    )
    audit_max_bytes: int = Field(
        default=DEFAULT_MAX_BYTES, description="Rotate the audit file before it passes this."
    )
    audit_backups: int = Field(default=DEFAULT_BACKUPS, description="Rotated audit files kept.")
    catalog: str | None = Field(default=None, description=CATALOG_HELP)
    bulk_port: int | None = Field(
        default=None,
        description="Also serve block bytes on this port of --listen's host, beside gRPC (the "
        "bulk channel: sendfile, same tokens, TLS and limits); 0 picks a free port.",
    )
    bulk_port_file: Path | None = Field(
        default=None, description="Write the bound bulk port to this file."
    )
    bulk_max_connections: int = Field(
        default=BULK_CONNECTIONS,
        description="Most bulk connections open at once (a spoke holds one per fetch worker).",
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
        """Flags, then ``STRATA_HUB_*`` variables, then the TOML file of ``--config`` or
        ``CONFIG_ENV``."""
        return config_sources(settings_cls, init_settings, env_settings, CONFIG_ENV)

    def server_config(self) -> ServerConfig:
        """What :class:`~hub.serve.server.HubServer` runs with, beyond its directory and
        address."""
        return ServerConfig(
            tls_cert=self.tls_cert,
            tls_key=self.tls_key,
            client_ca=self.client_ca,
            tokens=self.tokens,
            insecure=self.insecure,
            max_message_bytes=self.max_message_bytes,
            blobs=self.blobs,
            s3_endpoint=self.s3_endpoint,
            catalog=self.catalog,
            grant_key=self.grant_key,
            grant_lifetime_s=self.grant_lifetime,
            rotate_grant_key=self.rotate_grant_key,
            audit_log=self.audit_log,
            audit_max_bytes=self.audit_max_bytes,
            audit_backups=self.audit_backups,
            max_connections=self.max_connections,
            handshake_timeout_s=self.handshake_timeout,
            max_streams_per_token=self.max_streams_per_token,
            max_block_streams=self.max_block_streams,
            max_bytes_per_token=self.max_bytes_per_token,
            max_bytes_in_flight=self.max_bytes_in_flight,
            budget_wait_s=self.budget_wait,
            stall_timeout_s=self.stall_timeout,
            grant_holders_per_token=self.grant_holders_per_token,
            max_manifest_streams=self.max_manifest_streams,
            max_watch_streams=self.max_watch_streams,
            bulk_port=self.bulk_port,
            bulk_max_connections=self.bulk_max_connections,
        )

    @model_validator(mode="after")
    def _limits(self) -> HubServeSettings:
        if self.bulk_port is None and (
            self.bulk_port_file is not None or self.bulk_max_connections != BULK_CONNECTIONS
        ):
            raise ValueError("--bulk-port-file and --bulk-max-connections need --bulk-port")
        try:
            self.server_config().validate()
        except ConfigError as err:
            raise ValueError(str(err)) from None
        return self


SERVE_OPTIONS = declared(HubServeSettings, env_prefix=ENV_PREFIX)
"""Every option of ``strata-hub serve``, in declaration order, from the one schema."""


def serve_settings(received: dict[str, Any]) -> HubServeSettings:
    """The settings of the flags ``serve`` received (None: not given), the variables and the
    config file (``received["config"]``).

    Raises:
        ConfigError: they are not valid, or the config file is unusable (one line).
    """
    values = given(SERVE_OPTIONS, received)
    try:
        return load(HubServeSettings, values, received.get("config"), CONFIG_ENV)
    except ValidationError as err:
        raise ConfigError(problem(err, SERVE_OPTIONS, ENV_PREFIX)) from None
    except ConfigFileError as err:
        raise ConfigError(str(err)) from None
