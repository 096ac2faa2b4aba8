"""The managed token file: create, list, revoke and migrate tokens (``strata-hub token``).

Only the SHA-256 of a secret is stored (:mod:`hub.auth.tokens` describes the format); the secret
is returned once by :func:`create` and never again. Writes are atomic (a temporary file in
the same directory, ``fsync``, ``rename(2)``) and made with mode 0600, under an exclusive
``flock`` of ``FILE.lock`` so that two commands never lose each other's change. A serving
hub picks the new file up on its next call (:class:`hub.auth.tokens.TokenFile`).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import re
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hub.auth.tokens import MANAGED_VERSION, TokenTable, _scopes, hash_token, parse_timestamp
from hub.errors import ConfigError, NotFound
from strata_local.atomic import write_atomic

SECRET_PREFIX = "strata_"
"""Every generated secret starts with this (easy to spot in a leaked file or a paste)."""

_DURATION = re.compile(r"(\d+)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

_HEADER = (
    "# Strata hub tokens, managed by `strata-hub token`: only SHA-256 hashes of the secrets\n"
    "# are stored here. A serving hub re-reads this file when it changes.\n"
)


def parse_duration(text: str) -> datetime.timedelta:
    """``30d``, ``12h``, ``90m``, ``2w``, ``3600s`` or a sum such as ``1d12h``.

    Raises:
        ConfigError: not such a duration, or zero.
    """
    value = text.strip().lower()
    parts = _DURATION.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ConfigError(f"{text!r} is not a duration such as 30d, 12h, 90m or 1w")
    seconds = sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)
    if seconds <= 0:
        raise ConfigError(f"duration {text!r} must be positive")
    return datetime.timedelta(seconds=seconds)


@dataclass(frozen=True)
class TokenInfo:
    """One stored token, without its secret."""

    id: str
    datasets: tuple[str, ...]
    created: datetime.datetime | None
    expires: datetime.datetime | None

    def state(self, now: datetime.datetime) -> str:
        """``active`` or ``expired`` at ``now``."""
        return "expired" if self.expires is not None and self.expires <= now else "active"


def _load(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"version": MANAGED_VERSION, "tokens": {}}
    TokenTable.load(path)  # validates, with the same (secret-free) errors as serve
    text = path.read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if "version" not in data and "tokens" not in data:
        raise ConfigError(
            f"token file {path} holds plain tokens; run `strata-hub token migrate --tokens "
            f"{path}` first (the tokens keep working, only their hashes are kept)"
        )
    data["tokens"] = data.get("tokens") or {}
    return data


def _dump(path: Path, data: dict[str, Any]) -> None:
    if path.suffix == ".toml":
        raise ConfigError(f"{path}: managed token files are YAML or JSON, not TOML")
    if path.suffix == ".json":
        text = json.dumps(data, indent=2, default=str) + "\n"
    else:
        text = _HEADER + yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    write_atomic(path, text.encode("utf-8"))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _iso(when: datetime.datetime | None) -> str | None:
    return when.isoformat(timespec="seconds") if when is not None else None


def create(
    path: Path,
    datasets: Sequence[str],
    expires_in: datetime.timedelta | None = None,
    now: datetime.datetime | None = None,
) -> tuple[str, str]:
    """Add a token that may read ``datasets`` (globs, or ``["*"]``).

    Returns:
        ``(token id, secret)``; the secret is not stored and cannot be shown again.

    Raises:
        ConfigError: a malformed scope, or a file that is not a managed token file.
    """
    scopes = _scopes(1, "*" if list(datasets) == ["*"] else list(datasets))
    now = now or datetime.datetime.now(datetime.UTC)
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    with _locked(path):
        data = _load(path)
        token_id = "tok-" + secrets.token_hex(4)
        while token_id in data["tokens"]:
            token_id = "tok-" + secrets.token_hex(4)
        data["tokens"][token_id] = {
            "sha256": hash_token(secret).hex(),
            "datasets": list(scopes),
            "created": _iso(now),
            "expires": _iso(now + expires_in) if expires_in is not None else None,
        }
        _dump(path, data)
    return token_id, secret


def entries(path: Path) -> list[TokenInfo]:
    """Every stored token, in file order.

    Raises:
        ConfigError: the file is missing or not a managed token file.
    """
    if not path.exists():
        raise ConfigError(f"token file {path} does not exist")
    data = _load(path)
    out = []
    for token_id, entry in data["tokens"].items():
        where = f"token file {path}: {token_id}"
        out.append(
            TokenInfo(
                token_id,
                tuple(entry["datasets"]) if entry["datasets"] != "*" else ("*",),
                parse_timestamp(entry.get("created"), where),
                parse_timestamp(entry.get("expires"), where),
            )
        )
    return out


def revoke(path: Path, token_id: str) -> None:
    """Remove a token; a serving hub refuses it from its next call on.

    Raises:
        NotFound: no token has this id.
        ConfigError: the file is missing or not a managed token file.
    """
    with _locked(path):
        if not path.exists():
            raise ConfigError(f"token file {path} does not exist")
        data = _load(path)
        if token_id not in data["tokens"]:
            raise NotFound(f"no token {token_id!r} in {path}")
        del data["tokens"][token_id]
        _dump(path, data)


def migrate(path: Path, now: datetime.datetime | None = None) -> list[str]:
    """Rewrite a plain token file in the managed format; the same secrets keep working.

    Returns:
        The ids given to the tokens, in file order.

    Raises:
        ConfigError: the file cannot be read, or is already managed.
    """
    now = now or datetime.datetime.now(datetime.UTC)
    with _locked(path):
        TokenTable.load(path)
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            data = json.loads(text)
        elif path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            data = yaml.safe_load(text)
        if "version" in data or "tokens" in data:
            raise ConfigError(f"token file {path} is already in the managed format")
        tokens: dict[str, Any] = {}
        for number, (secret, scopes) in enumerate(data.items(), start=1):
            digest = hash_token(secret).hex()
            tokens[f"tok-{digest[:8]}"] = {
                "sha256": digest,
                "datasets": list(_scopes(number, scopes)),
                "created": _iso(now),
                "expires": None,
            }
        target = path.with_suffix(".yaml") if path.suffix == ".toml" else path
        _dump(target, {"version": MANAGED_VERSION, "tokens": tokens})
        if target != path:
            path.unlink()
    return list(tokens)
