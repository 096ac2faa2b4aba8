"""Who proved a credential from which network lately: the callers whose handshakes' turns
come first (:mod:`strata_local.handshakes`), kept across a restart.

A door learns them as calls prove a token (:meth:`KnownHosts.add`), so a process that had
just started knew nobody: the twenty-first probe restarted a hub with 500 spokes while
whole ClientHellos came from 60,000 new addresses at 4,000 a second, and only 69 of the
spokes were back after 1 s, 301 after 18 s — every spoke was as new as the flood. A hub
now writes what its doors know to its data directory (:meth:`KnownHosts.save`, every
:data:`SAVE_EVERY_S` and as it stops) and reads it as it starts (:meth:`KnownHosts.load`),
so a returning fleet has its turns first at once.

The file is JSON, written whole or not at all (:func:`strata_local.atomic.write_atomic`,
mode 0600): ``{"format": 1, "hosts": [[network, subject, proved_at], ...]}``, least
recently proven first, ``proved_at`` in Unix seconds (the monotonic clock does not
survive a restart). One that cannot be read or parsed is reported and ignored: the door
then starts knowing nobody, as it did before.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from strata_local.atomic import write_atomic

log = logging.getLogger(__name__)

KNOWN_S = 3600.0
"""How long a network that proved a credential has its turns first, seconds."""

KNOWN_MOST = 65536
"""Most networks remembered as known (the least recently proven are forgotten first)."""

SAVE_EVERY_S = 30.0
"""How often a server writes its known networks to its data directory, seconds (when they
changed): a spoke that first proved itself less than this before a crash is new again."""

FORMAT = 1
"""The file's format (``"format"``); another is ignored."""

SKEW_S = 60.0
"""How far in the future a file's ``proved_at`` may be (the wall clock stepped back
since), seconds; one further is not believed."""

LOAD_MOST_BYTES = 16 << 20
"""Largest file :meth:`KnownHosts.load` reads (65,536 entries take about 5 MiB)."""


class KnownHosts:
    """Networks that proved a credential lately, and whose (the token's subject, say):
    at most ``most``, each for ``keep_s``.

    Args:
        most: Most networks remembered.
        keep_s: Seconds a network is remembered after it last proved one (None:
            :data:`KNOWN_S` as it is when made).
        clock: Monotonic seconds.
        wall: Unix seconds (for :meth:`save` and :meth:`load` only).

    Attributes:
        changes: How many times :meth:`add` was called (a saver writes when it moved).

    Not thread-safe: one event loop owns it.
    """

    def __init__(
        self,
        most: int = KNOWN_MOST,
        keep_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.most, self._clock, self._wall = most, clock, wall
        self.keep_s = KNOWN_S if keep_s is None else keep_s
        self._proved: collections.OrderedDict[str, tuple[float, str]] = collections.OrderedDict()
        self.changes = 0

    def add(self, host: str, subject: str) -> None:
        """``host`` (a caller's network) proved ``subject``'s credential now."""
        self._remember(host, self._clock(), subject)
        self.changes += 1

    def subject(self, host: str) -> str | None:
        """Whose credential ``host`` proved within :attr:`keep_s`; None: none."""
        proved = self._proved.get(host)
        if proved is None:
            return None
        if self._clock() - proved[0] > self.keep_s:
            del self._proved[host]
            return None
        return proved[1]

    def __contains__(self, host: object) -> bool:
        return isinstance(host, str) and self.subject(host) is not None

    def __len__(self) -> int:
        return len(self._proved)

    def save(self, path: Path) -> int:
        """Writes the networks proven within :attr:`keep_s` to ``path`` (see the module),
        whole or not at all; returns how many.

        Raises:
            OSError: It could not be written (nothing is left behind).
        """
        hosts, data = self._document()
        write_atomic(path, data)
        return hosts

    async def save_every(self, path: Path, every_s: float = SAVE_EVERY_S) -> None:
        """Saves to ``path`` every ``every_s`` seconds when :meth:`add` was called since
        (the file written in a thread; one that cannot be written is logged and tried
        again next time), until cancelled. A server runs it as a task and calls
        :meth:`save` once more as it stops."""
        saved = self.changes
        while True:
            await asyncio.sleep(every_s)
            if self.changes == saved:
                continue
            saved = self.changes
            _, data = self._document()
            try:
                await asyncio.to_thread(write_atomic, path, data)
            except OSError as err:
                log.warning("known callers not saved to %s: %s", path, err)

    def _document(self) -> tuple[int, bytes]:
        """How many networks are known, and the file that holds them."""
        now, wall = self._clock(), self._wall()
        hosts = [
            [host, subject, round(wall - (now - at), 3)]
            for host, (at, subject) in self._proved.items()
            if now - at <= self.keep_s
        ]
        return len(hosts), json.dumps({"format": FORMAT, "hosts": hosts}).encode()

    def load(self, path: Path) -> int:
        """Adds the networks ``path`` holds that proved a credential within :attr:`keep_s`
        (as long ago as the file says, by the wall clock); returns how many. A missing
        file adds none; one that cannot be read or is not this format is logged and
        ignored (the caller starts knowing nobody, as a new server does)."""
        try:
            with path.open("rb") as stream:
                data = stream.read(LOAD_MOST_BYTES + 1)
        except FileNotFoundError:
            return 0
        except OSError as err:
            log.warning("known callers not read from %s: %s", path, err)
            return 0
        try:
            if len(data) > LOAD_MOST_BYTES:
                raise ValueError(f"larger than {LOAD_MOST_BYTES} bytes")
            hosts = _parse(json.loads(data))
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            log.warning("known callers not read from %s: %s", path, err)
            return 0
        now, wall, added = self._clock(), self._wall(), 0
        for host, subject, proved_at in hosts:
            age = wall - proved_at  # a clock stepped back a little: proven now
            if -SKEW_S <= age <= self.keep_s and host not in self._proved:
                self._remember(host, now - max(0.0, age), subject)
                added += 1
        return added

    def _remember(self, host: str, at: float, subject: str) -> None:
        self._proved[host] = (at, subject)
        self._proved.move_to_end(host)
        while len(self._proved) > self.most:
            self._proved.popitem(last=False)


def _parse(document: object) -> list[tuple[str, str, float]]:
    """The ``hosts`` of a known-callers file, checked.

    Raises:
        ValueError: It is not format :data:`FORMAT`, or an entry is not
            ``[network, subject, seconds]``.
    """
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"not a known-callers file of format {FORMAT}")
    entries = document.get("hosts")
    if not isinstance(entries, list):
        raise ValueError("its hosts are not a list")
    hosts: list[tuple[str, str, float]] = []
    for entry in entries:
        if (
            not isinstance(entry, list)
            or len(entry) != 3
            or not isinstance(entry[0], str)
            or not isinstance(entry[1], str)
            or isinstance(entry[2], bool)
            or not isinstance(entry[2], int | float)
        ):
            raise ValueError(f"an entry is not [network, subject, seconds]: {entry!r:.80}")
        hosts.append((entry[0], entry[1], float(entry[2])))
    return hosts
