"""Spoke settings (pydantic-settings): command-line flags, or ``STRATA_SPOKE_*`` variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ByteSize, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from spoke.layout import CacheLayout
from spoke.mesh.settings import MeshSettings


def parse_hostport(value: str, what: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (IPv6 hosts in brackets).

    Raises:
        ValueError: not HOST:PORT, or the port is outside 0..65535.
    """
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what} must be HOST:PORT, got {value!r}")
    return host, int(port)


MAX_SOCKET_PATH = 107
"""Longest path of a UNIX socket, bytes (``sun_path`` is 108 bytes with its NUL; unix(7))."""


class SpokeSettings(BaseSettings):
    """Everything a spoke daemon and its mount need.

    Sizes accept units (``10GiB``, ``512MB``); times are seconds.
    """

    model_config = SettingsConfigDict(env_prefix="STRATA_SPOKE_")

    hub: str = Field(description="the hub's HOST:PORT")
    cache_dir: Path = Field(description="directory of the block cache")
    cache_size: ByteSize = Field(description="most bytes of blocks kept on disk")
    mount: Path | None = Field(default=None, description="mountpoint of the read-only tree")
    admin: str = Field(default="127.0.0.1:7878", description="admin API HOST:PORT")
    policy: Literal["arc", "lru"] = Field(default="arc", description="eviction policy")
    high_watermark: float = Field(default=0.95, gt=0, le=1, description="start evicting above")
    low_watermark: float = Field(default=0.90, gt=0, le=1, description="evict down to")
    miss_deadline: float = Field(default=60.0, gt=0, description="longest wait of a miss")
    allow_other: bool = Field(default=False, description="let other users read the mount")
    admin_token_file: Path | None = Field(
        default=None, description="file holding the admin API's bearer token"
    )
    read_ahead_kb: int = Field(default=1024, ge=0, description="kernel readahead of the mount")
    background_fill: Literal["auto", "off"] = Field(
        default="off", description="fetch the rest of snapshots being read, at lowest priority"
    )
    fill_rate: ByteSize | None = Field(
        default=None, description="most bytes per second background fill uses (None: no cap)"
    )
    mesh: MeshSettings | None = Field(
        default=None, description="the region's spoke mesh (spoke/mesh/); None: hub only"
    )
    fill_share: float = Field(
        default=0.5, gt=0, le=1, description="fill snapshots that fit in this share of the cache"
    )

    @field_validator("hub")
    @classmethod
    def _hub(cls, v: str) -> str:
        parse_hostport(v, "--hub")
        return v

    @field_validator("admin")
    @classmethod
    def _admin(cls, v: str) -> str:
        parse_hostport(v, "--admin")
        return v

    @field_validator("admin_token_file")
    @classmethod
    def _token(cls, v: Path | None) -> Path | None:
        if v is not None and not (v.is_file() and v.read_text().strip()):
            raise ValueError(f"--admin-token-file {v} is missing or empty")
        return v

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

    @field_validator("fill_rate")
    @classmethod
    def _fill_rate(cls, v: ByteSize | None) -> ByteSize | None:
        if v is not None and v <= 0:
            raise ValueError("--fill-rate must be a positive size per second, e.g. 50MiB")
        return v
