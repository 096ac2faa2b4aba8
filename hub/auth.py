"""Bearer tokens with per-dataset read scope.

A token file maps each token to the datasets it may read, as a list of shell-style globs
(``fnmatch``: ``*``, ``?``, ``[...]``) or the single string ``"*"`` for every dataset.
YAML (``.yaml``/``.yml``, read with PyYAML's safe loader), TOML (``.toml``) and JSON
(``.json``) files are accepted::

    # tokens.yaml
    "3d1f0c9a8e2b47d5a6c1f0e9b8a7c6d5": ["f3", "f3-*"]   # a training job
    "a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3": "*"              # the platform team

Clients send ``authorization: Bearer <token>`` as gRPC metadata (RFC 6750 §2.1; gRPC
authentication guide, https://grpc.io/docs/guides/auth/). The presented token is hashed
with SHA-256 and compared with every known token's hash by :func:`hmac.compare_digest`,
without stopping at a match, so the time taken does not depend on how much of a token an
attacker guessed right.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import os
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from hub.errors import ConfigError, PermissionDenied, Unauthenticated

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
        name: A label for logs, never the token itself (``"anonymous"`` or ``"token N"``).
        scopes: Dataset globs the caller may read; ``("*",)`` reads everything.
    """

    name: str
    scopes: tuple[str, ...]

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
            f'token {token_number}: expected a list of dataset globs or "*", got {value!r}'
        )
    for scope in value:
        if not _SCOPE_PATTERN.fullmatch(scope):
            raise ConfigError(f"token {token_number}: invalid dataset glob {scope!r}")
    return tuple(value)


class TokenTable:
    """The tokens a hub accepts and their read scopes.

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
            principal = Principal(f"token {number}", _scopes(number, list(scopes)))
            self._entries.append((hashlib.sha256(token.encode("ascii")).digest(), principal))

    def __len__(self) -> int:
        return len(self._entries)

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
        except (ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot parse token file {file}: {exc}") from exc
        if not isinstance(data, dict) or not data:
            raise ConfigError(f"token file {file}: expected a mapping of token to dataset globs")
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
        return found
