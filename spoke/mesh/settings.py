"""The mesh's settings: the peer port, who the peers are, and how calls between them are
secured (``--peer-listen``, ``--peers``, ``--peers-dns``, ``--peer-token-file``, …), and
whether block bytes between them take the bulk channel (``--peer-bulk-port``).

The peer port is TLS with a region token unless ``--peer-insecure`` says otherwise (as the
hub refuses tokens without TLS unless ``--insecure``): a spoke given ``--peer-listen``
without ``--peer-cert``/``--peer-key`` and ``--peer-token-file`` does not start."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from protocol.address import parse_option_hostport

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


class MeshSettings(BaseModel):
    """A spoke's place in its region's mesh. With no peers the mesh is just the hub.

    Node names are ``HOST:PORT`` strings and must be the same everywhere: a spoke's
    ``advertise`` is what the others list in ``--peers`` (or what ``--peers-dns`` resolves
    to), since the owner of a block is computed from these names.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    listen: str = Field(
        description="join the region's mesh: serve blocks to other spokes on HOST:PORT",
        json_schema_extra={"flag": "--peer-listen"},
    )
    advertise: str | None = Field(
        default=None,
        description="this spoke's name in the mesh, HOST:PORT (default: listen)",
        json_schema_extra={"flag": "--peer-advertise"},
    )
    peers: tuple[str, ...] = Field(
        default=(),
        description="the region's spokes, HOST:PORT,HOST:PORT,…",
        json_schema_extra={"flag": "--peers"},
    )
    peers_dns: str | None = Field(
        default=None,
        description="NAME or NAME:PORT resolving to every spoke (a headless Service); "
        "the port defaults to listen's",
        json_schema_extra={"flag": "--peers-dns"},
    )
    token_file: Path | None = Field(
        default=None,
        description="file with the region's token",
        json_schema_extra={"flag": "--peer-token-file"},
    )
    cert: Path | None = Field(
        default=None,
        description="TLS certificate of the peer port (PEM)",
        json_schema_extra={"flag": "--peer-cert"},
    )
    key: Path | None = Field(
        default=None, description="its private key (PEM)", json_schema_extra={"flag": "--peer-key"}
    )
    ca: Path | None = Field(
        default=None,
        description="CA (PEM) peers' certificates must chain to: mTLS",
        json_schema_extra={"flag": "--peer-ca"},
    )
    server_name: str | None = Field(
        default=None,
        description="the name in peers' certificates, when it is not the host they are "
        "dialled by (one certificate for the region)",
        json_schema_extra={"flag": "--peer-server-name"},
    )
    insecure: bool = Field(
        default=False,
        description="allow a plaintext peer port and no region token (trusted networks only)",
        json_schema_extra={"flag": "--peer-insecure"},
    )
    grant_key: Path | None = Field(
        default=None,
        description="the hub's grant public key (PEM) to check peers' read grants with, "
        "pinned instead of asking the hub",
        json_schema_extra={"flag": "--peer-grant-key"},
    )
    timeout: float = Field(
        default=2.0,
        gt=0,
        description="seconds a peer may take per block before it is skipped",
        json_schema_extra={"flag": "--peer-timeout"},
    )
    probe_interval: float = Field(
        default=2.0,
        gt=0,
        description="seconds between probes of the peers",
        json_schema_extra={"flag": "--peer-probe-interval"},
    )
    max_connections: int = Field(
        default=1024,  # spoke.mesh.transport.MAX_CONNECTIONS
        description="most connections open to the peer port at once; more are closed as "
        "they arrive (each spoke of the region holds one to every other); with "
        "--peer-bulk-port, half for each port",
        json_schema_extra={"flag": "--peer-max-connections"},
    )

    bulk_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="serve peers' block reads on this port of listen's host over the bulk "
        "channel (sendfile; the peer port's TLS and token) and read from other spokes' on "
        "the same port: every spoke of the region gives the same one; 0: off, blocks go "
        "over the peer port's gRPC",
        json_schema_extra={"flag": "--peer-bulk-port"},
    )

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        parse_option_hostport(v, "--peer-listen")
        return v

    @field_validator("max_connections")
    @classmethod
    def _max_connections(cls, v: int) -> int:
        if v < 8:
            raise ValueError(f"--peer-max-connections must be at least 8, got {v}")
        return v

    @field_validator("advertise")
    @classmethod
    def _advertise(cls, v: str | None) -> str | None:
        if v is not None:
            host, port = parse_option_hostport(v, "--peer-advertise")
            if host in WILDCARD_HOSTS or port == 0:
                raise ValueError(f"--peer-advertise must name one host and port, got {v!r}")
        return v

    @field_validator("peers", mode="before")
    @classmethod
    def _peer_list(cls, v: object) -> object:
        """``--peers a:1,b:2`` (or a variable's string) as the tuple it stands for."""
        return split_peers(v) if isinstance(v, str) else v

    @field_validator("peers")
    @classmethod
    def _peers(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for peer in v:
            parse_option_hostport(peer, "--peers")
        return v

    @field_validator("peers_dns")
    @classmethod
    def _dns(cls, v: str | None) -> str | None:
        if v is not None and (not v or v.startswith(":") or " " in v):
            raise ValueError(f"--peers-dns must be NAME or NAME:PORT, got {v!r}")
        return v

    @field_validator("token_file", "cert", "key", "ca", "grant_key")
    @classmethod
    def _file(cls, v: Path | None) -> Path | None:
        if v is not None and not (v.is_file() and v.read_bytes().strip()):
            raise ValueError(f"--peer file {v} is missing or empty")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> MeshSettings:
        if (self.cert is None) != (self.key is None):
            raise ValueError("--peer-cert and --peer-key go together")
        if self.ca is not None and self.cert is None:
            raise ValueError("--peer-ca (mTLS) needs --peer-cert and --peer-key")
        if self.server_name is not None and self.cert is None:
            raise ValueError("--peer-server-name needs TLS (--peer-cert and --peer-key)")
        if not self.insecure and self.cert is None:
            raise ValueError(
                "--peer-listen without --peer-cert/--peer-key would serve blocks in "
                "cleartext: give them (and --peer-ca for mTLS), or --peer-insecure on a "
                "trusted network"
            )
        if not self.insecure and self.token_file is None:
            raise ValueError(
                "--peer-listen without --peer-token-file would let anyone who reaches the "
                "peer port call it: give the region's token, or --peer-insecure"
            )
        if (
            self.bulk_port
            and self.bulk_port == parse_option_hostport(self.listen, "--peer-listen")[1]
        ):
            raise ValueError(
                f"--peer-bulk-port {self.bulk_port} is the peer port's (--peer-listen); give "
                "another"
            )
        if self.advertise is None:
            host, port = parse_option_hostport(self.listen, "--peer-listen")
            if host in WILDCARD_HOSTS or port == 0:
                raise ValueError(
                    f"--peer-listen {self.listen} is not a name peers can dial: "
                    "give --peer-advertise HOST:PORT"
                )
        return self

    @model_validator(mode="after")
    def _usable(self) -> MeshSettings:
        """The certificates load and match, and the pinned grant key is an Ed25519 key
        (after :meth:`_consistent`, which pydantic runs first: it is defined first)."""
        from spoke.hublink.credentials import CredentialError
        from spoke.mesh.grants import GrantKeyError, load_public_key
        from spoke.mesh.transport import PeerTls

        try:
            if self.cert is not None and self.key is not None:
                PeerTls(self.cert, self.key, self.ca, self.server_name)
            if self.grant_key is not None:
                load_public_key(self.grant_key)
        except (CredentialError, GrantKeyError) as err:
            raise ValueError(str(err)) from None
        return self

    @property
    def node(self) -> str:
        """This spoke's name in the mesh."""
        return self.advertise or self.listen

    @property
    def dns(self) -> tuple[str, int] | None:
        """``(name, port)`` of ``peers_dns``, or None."""
        if self.peers_dns is None:
            return None
        name, sep, port = self.peers_dns.rpartition(":")
        if sep and port.isdigit():
            return name, int(port)
        return self.peers_dns, parse_option_hostport(self.listen, "--peer-listen")[1]


def split_peers(value: str | None) -> tuple[str, ...]:
    """``"a:1, b:2"`` → ``("a:1", "b:2")`` (empty items dropped)."""
    return tuple(p.strip() for p in (value or "").split(",") if p.strip())
