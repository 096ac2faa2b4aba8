"""Bearer tokens with per-dataset read scope.

Scopes are shell-style globs (``fnmatch``: ``*``, ``?``, ``[...]``) or the single string
``"*"`` for every dataset. Two token file formats are read; YAML (``.yaml``/``.yml``, read
with PyYAML's safe loader), TOML (``.toml``) and JSON (``.json``) for both:

- **managed** (written by ``strata-hub token create``; :mod:`hub.auth.tokenstore`): only the
  SHA-256 of each secret is stored, with an id, the scopes and an optional expiry::

      version: 2
      tokens:
        tok-5f2c9a1b:
          sha256: 9b74c9897bac770ffc029102a200c5de...
          datasets: ["f3"]
          created: "2026-12-01T09:00:00+00:00"
          expires: "2026-12-31T09:00:00+00:00"   # null: never

- **plain** (kept working; secrets in the clear, no expiry) maps each token to its scopes::

      "3d1f0c9a8e2b47d5a6c1f0e9b8a7c6d5": ["f3", "f3-*"]   # a training job
      "a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3": "*"              # the platform team

  ``strata-hub token migrate`` rewrites such a file in the managed format.

:class:`TokenFile` re-reads the file when it changes (inode, size, mtime; checked on each
call), so a created, revoked or expired token takes effect without a restart; a file that
no longer parses keeps the previous table and logs why. No error or log line ever contains
a secret (a YAML error reports only its line and column).

Clients send ``authorization: Bearer <token>`` as gRPC metadata (RFC 6750 §2.1; gRPC
authentication guide, https://grpc.io/docs/guides/auth/). The presented token is hashed
with SHA-256 and compared with every known token's hash by :func:`hmac.compare_digest`,
without stopping at a match, so the time taken does not depend on how much of a token an
attacker guessed right.
"""

from __future__ import annotations

import datetime
import fnmatch
import hashlib
import hmac
import json
import logging
import os
import re
import threading
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from hub.errors import ConfigError, PermissionDenied, Unauthenticated

logger = logging.getLogger(__name__)

MANAGED_VERSION = 2
"""``version`` of the managed token file format."""

_ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")

MIN_TOKEN_CHARS = 16
"""Shortest token accepted in a token file, characters (guards against toy secrets)."""

AUTHORIZATION = "authorization"
"""The gRPC metadata key that carries the bearer token (lower case, as gRPC requires)."""

_SCOPE_PATTERN = re.compile(r"[a-z0-9._*?\[\]!-]{1,64}")
_TOKEN_PATTERN = re.compile(r"[\x21-\x7e]+")  # visible ASCII, RFC 6750's b64token and more


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling and which datasets they may read.

    Attributes:
        name: A label for logs, never the token itself (``"anonymous"``, the managed
            token's id, or ``"token N"`` for a plain file's N-th token).
        scopes: Dataset globs the caller may read; ``("*",)`` reads everything.
        expires: When the token stops working (None: never).
    """

    name: str
    scopes: tuple[str, ...]
    expires: datetime.datetime | None = None

    def may_read(self, dataset: str) -> bool:
        """Tells whether the caller may read ``dataset``."""
        return any(fnmatch.fnmatchcase(dataset, scope) for scope in self.scopes)

    def require(self, dataset: str) -> None:
        """Checks read access to ``dataset``.

        Raises:
            PermissionDenied: The caller's scope does not cover ``dataset``.
        """
        if not self.may_read(dataset):
            raise PermissionDenied(f"this token may not read dataset {dataset!r}")


ANONYMOUS = Principal("anonymous", ("*",))
"""The caller when the hub runs without tokens: every dataset is readable."""


def _scopes(token_number: int, value: object) -> tuple[str, ...]:
    if value == "*":
        return ("*",)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            f'token {token_number}: expected a list of dataset globs or "*", '
            f"got {type(value).__name__}"
        )
    for position, scope in enumerate(value, start=1):
        if not _SCOPE_PATTERN.fullmatch(scope):  # not echoed: it could be a misplaced secret
            raise ConfigError(
                f"token {token_number}: dataset glob {position} is not a valid glob "
                "(1-64 of a-z 0-9 . _ - * ? [ ] !)"
            )
    return tuple(value)


class TokenTable:
    """The tokens a hub accepts and their read scopes. A plain token's principal is named
    ``token`` and the first 6 bytes of its SHA-256 in hex (a managed file's, its id).

    Args:
        tokens: ``token -> dataset globs``.

    Raises:
        ConfigError: A token is shorter than :data:`MIN_TOKEN_CHARS` or not visible ASCII,
            or a scope is malformed.
    """

    def __init__(self, tokens: dict[str, tuple[str, ...]]) -> None:
        self._entries: list[tuple[bytes, Principal]] = []
        for number, (token, scopes) in enumerate(tokens.items(), start=1):
            if len(token) < MIN_TOKEN_CHARS or not _TOKEN_PATTERN.fullmatch(token):
                raise ConfigError(
                    f"token {number}: tokens must be at least {MIN_TOKEN_CHARS} visible "
                    "ASCII characters"
                )
            hashed = hash_token(token)
            # named by its hash, not its place in the file: a name is who a door slot,
            # a budget and a grant count for, and an edit that moved the lines gave a
            # proven connection another token's name until it reconnected
            principal = Principal(f"token {hashed[:6].hex()}", _scopes(number, list(scopes)))
            self._entries.append((hashed, principal))

    def __len__(self) -> int:
        return len(self._entries)

    @classmethod
    def from_hashes(cls, entries: Iterable[tuple[bytes, Principal]]) -> TokenTable:
        """A table of SHA-256 token hashes (32 bytes each) and their principals."""
        table = cls({})
        table._entries = list(entries)
        return table

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TokenTable:
        """Reads a token file (YAML, TOML or JSON, by extension; YAML otherwise).

        Args:
            path: The file.

        Returns:
            The tokens.

        Raises:
            ConfigError: The file cannot be read or parsed, is not a mapping of token to
                scopes, or holds no token.
        """
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read token file {file}: {exc}") from exc
        try:
            if file.suffix == ".json":
                data: object = json.loads(text)
            elif file.suffix == ".toml":
                data = tomllib.loads(text)
            else:
                data = yaml.safe_load(text)
        except yaml.YAMLError as exc:  # str(exc) quotes the line: it may hold a token
            raise ConfigError(f"cannot parse token file {file}: {_yaml_where(exc)}") from None
        except ValueError as exc:  # json and tomllib say only where, never the text
            raise ConfigError(f"cannot parse token file {file}: {exc}") from None
        if not isinstance(data, dict) or not data:
            raise ConfigError(f"token file {file}: expected a mapping of token to dataset globs")
        if "version" in data or "tokens" in data:  # too short to be plain tokens
            return cls.from_hashes(parse_managed(data, file))
        tokens: dict[str, tuple[str, ...]] = {}
        for number, (token, value) in enumerate(data.items(), start=1):
            if not isinstance(token, str):
                raise ConfigError(f"token file {file}: token {number} is not a string")
            tokens[token] = _scopes(number, value)
        return cls(tokens)

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]]) -> Principal:
        """Finds the caller from a call's metadata.

        Args:
            metadata: The call's invocation metadata (key, value) pairs.

        Returns:
            The caller.

        Raises:
            Unauthenticated: No ``authorization`` metadata, not ``Bearer <token>``, or a
                token this table does not hold.
        """
        values = [value for key, value in metadata if key == AUTHORIZATION]
        if not values:
            raise Unauthenticated(
                "missing bearer token: send the metadata 'authorization: Bearer <token>'"
            )
        if len(values) > 1:
            raise Unauthenticated("more than one authorization metadata value")
        value = values[0]
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("malformed authorization metadata: expected 'Bearer <token>'")
        presented = hashlib.sha256(token.encode("utf-8", "replace")).digest()
        found: Principal | None = None
        for known, principal in self._entries:  # no early exit: constant time per table
            if hmac.compare_digest(presented, known):
                found = principal
        if found is None:
            raise Unauthenticated("unknown bearer token")
        if found.expires is not None and found.expires <= datetime.datetime.now(datetime.UTC):
            raise Unauthenticated(
                f"bearer token {found.name} expired at {found.expires:%Y-%m-%d %H:%M} UTC"
            )
        return found


def hash_token(token: str) -> bytes:
    """The SHA-256 of a token's UTF-8 bytes (what managed files store, hex-encoded)."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def _yaml_where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or "invalid YAML"
    if mark is None:
        return str(problem)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"


def parse_timestamp(value: object, where: str) -> datetime.datetime | None:
    """An ISO 8601 time (a string, or a YAML/TOML datetime) as an aware UTC datetime.

    Raises:
        ConfigError: not a time.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.datetime.fromisoformat(value)
        except ValueError:
            raise ConfigError(f"{where}: {value!r} is not an ISO 8601 time") from None
    if not isinstance(value, datetime.datetime):
        raise ConfigError(f"{where}: expected an ISO 8601 time")
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    return value.astimezone(datetime.UTC)


def parse_managed(data: Mapping[object, object], file: Path) -> list[tuple[bytes, Principal]]:
    """The entries of a managed token file (see the module docstring).

    Raises:
        ConfigError: another version, or a malformed entry.
    """
    if data.get("version") != MANAGED_VERSION:
        raise ConfigError(f"token file {file}: version must be {MANAGED_VERSION}")
    tokens = data.get("tokens") or {}
    if not isinstance(tokens, dict):
        raise ConfigError(f"token file {file}: 'tokens' must be a mapping of id to token")
    out = []
    for number, (token_id, entry) in enumerate(tokens.items(), start=1):
        if not isinstance(token_id, str) or not _ID_PATTERN.fullmatch(token_id):
            raise ConfigError(f"token file {file}: token {number} has an invalid id")
        if not isinstance(entry, dict):
            raise ConfigError(f"token file {file}: {token_id} is not a mapping")
        digest = entry.get("sha256")
        if not isinstance(digest, str) or not _SHA256_PATTERN.fullmatch(digest):
            raise ConfigError(f"token file {file}: {token_id}: sha256 must be 64 hex digits")
        scopes = _scopes(number, entry.get("datasets"))
        expires = parse_timestamp(entry.get("expires"), f"token file {file}: {token_id}")
        out.append((bytes.fromhex(digest), Principal(token_id, scopes, expires)))
    return out


class TokenFile:
    """A token file that is re-read when it changes, with :class:`TokenTable`'s
    ``authenticate``.

    Args:
        path: The token file.

    Raises:
        ConfigError: The file cannot be read or parsed at start.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self.table = TokenTable.load(self.path)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def __len__(self) -> int:
        return len(self.table)

    def reload_if_changed(self) -> bool:
        """Re-reads the file if it changed; returns True when a new table is in use.

        A file that is missing or does not parse leaves the previous table in use (the
        reason is logged, without any secret).
        """
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        with self._lock:
            if stamp == self._stamp:
                return False
            self._stamp = stamp
            try:
                table = TokenTable.load(self.path)
            except ConfigError as exc:
                logger.error("keeping the previous tokens: %s", exc)
                return False
            self.table = table
        logger.warning("token file %s reloaded: %d tokens", self.path, len(table))
        return True

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]]) -> Principal:
        """As :meth:`TokenTable.authenticate`, against the file's current contents."""
        self.reload_if_changed()
        return self.table.authenticate(metadata)
