"""Admin tokens scoped to datasets: a team prewarms, pins and hints its own datasets and
reads its own jobs, pins and hints through the admin API, and nothing else; the node-wide
admin token (``--admin-token-file``) stays the operator's.

The file (``strata-spoke run --admin-scoped-tokens FILE``, YAML, re-read when it changes)
names each token by a name and keeps only its SHA-256, never the secret:

```yaml
team-a:
  sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
  datasets: [team-a, "team-a-*"]
```

Make one with ``openssl rand -hex 32 > token-a; tr -d '\\n' < token-a | sha256sum``. A
presented token is hashed and compared with every entry in constant time
(``hmac.compare_digest``). A file that stops parsing keeps the last good table (and logs
why); an entry is refused at load when its hash is not 64 hex digits or its list is empty.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import re
from dataclasses import dataclass
from pathlib import Path

from strata_local.reloading import ReloadingFile, load_yaml

_SHA256 = re.compile(r"[0-9a-f]{64}")


Table = dict[str, tuple[bytes, tuple[str, ...]]]
"""Token name -> (SHA-256 digest, dataset globs)."""


class ScopedTokenError(ValueError):
    """A scoped-token file that cannot be read or does not parse (the message says where)."""


@dataclass(frozen=True)
class Caller:
    """Who called the admin API: the operator (every dataset) or a scoped token's holder.

    Attributes:
        name: The scoped token's name; None for the node-wide token (or no token at all).
        datasets: The dataset globs a scoped token may act on.
        tenants: How many scoped tokens the table held when this one was looked up (their
            shares are sized so that all of them together fit: ``routes.context``).
    """

    name: str | None = None
    datasets: tuple[str, ...] = ()
    tenants: int = 1

    @property
    def operator(self) -> bool:
        """Whether this is the node-wide token's holder."""
        return self.name is None

    def may(self, dataset: str) -> bool:
        """Whether the caller may act on ``dataset``."""
        return self.operator or any(fnmatch.fnmatchcase(dataset, g) for g in self.datasets)


OPERATOR = Caller()
"""The node-wide admin token's holder."""


def parse(
    text: str, where: str = "the scoped admin tokens"
) -> dict[str, tuple[bytes, tuple[str, ...]]]:
    """Name -> (SHA-256 digest, dataset globs).

    Raises:
        ScopedTokenError: not a mapping of names to ``{sha256, datasets}``.
    """
    loaded = load_yaml(text, where, ScopedTokenError)
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ScopedTokenError(f"{where} must map token names to {{sha256, datasets}}")
    table: dict[str, tuple[bytes, tuple[str, ...]]] = {}
    for name, entry in loaded.items():
        if not isinstance(name, str) or not isinstance(entry, dict):
            raise ScopedTokenError(f"{where}: {name!r} must map to {{sha256, datasets}}")
        digest, datasets = entry.get("sha256"), entry.get("datasets")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise ScopedTokenError(f"{where}: {name}'s sha256 is not 64 lower-case hex digits")
        if (
            not isinstance(datasets, list)
            or not datasets
            or not all(isinstance(d, str) and d for d in datasets)
        ):
            raise ScopedTokenError(f"{where}: {name} must list the datasets it may act on")
        if set(entry) - {"sha256", "datasets"}:
            raise ScopedTokenError(f"{where}: {name} has unknown keys {sorted(set(entry))}")
        twin = next((other for other, (d, _) in table.items() if d.hex() == digest), None)
        if twin is not None:  # one secret for two scopes: which one a holder gets is a guess
            raise ScopedTokenError(f"{where}: {name} and {twin} have the same sha256")
        table[name] = (bytes.fromhex(digest), tuple(datasets))
    return table


class ScopedTokens:
    """The scoped tokens in a file, re-read when it changes
    (:class:`strata_local.reloading.ReloadingFile`: a change that does not parse keeps the
    last good table, a removed file leaves no scoped token).

    Args:
        path: The YAML file.

    Raises:
        ScopedTokenError: it cannot be read or does not parse at start.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._file: ReloadingFile[Table] = ReloadingFile(path, parse, {}, required=True)
        except ScopedTokenError:
            raise
        except ValueError as err:  # unreadable
            raise ScopedTokenError(str(err)) from None

    def caller(self, presented: str) -> Caller | None:
        """The caller a presented token names, or None when no entry has it."""
        digest = hashlib.sha256(presented.encode()).digest()
        found = None
        table = self._file.current()
        for name, (expected, datasets) in table.items():
            if hmac.compare_digest(digest, expected):  # every entry compared: no early exit
                found = Caller(name, datasets, len(table))
        return found
