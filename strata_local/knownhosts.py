"""Who proved a credential from which address lately: the callers whose handshakes' turns
come first (:mod:`strata_local.handshakes`), kept across a restart.

A door learns them as calls prove a token (:meth:`KnownHosts.add`), so a process that had
just started knew nobody: the twenty-first probe restarted a hub with 500 spokes while
whole ClientHellos came from 60,000 new addresses at 4,000 a second, and only 69 of the
spokes were back after 1 s, 301 after 18 s — every spoke was as new as the flood. A hub
now writes what its doors know to its data directory (:meth:`KnownHosts.save_every`,
every :data:`SAVE_EVERY_S`, and :meth:`KnownHosts.save` as it stops) and reads it as it
starts (:meth:`KnownHosts.load`), so a returning fleet has its turns first at once.

The file is JSON, written whole or not at all (:func:`strata_local.atomic.write_atomic`,
mode 0600): ``{"format": 1, "hosts": [[address, subject, proved_at], ...]}``, least
recently proven first, ``proved_at`` in Unix seconds (the monotonic clock does not
survive a restart). One that is not a regular file of this user's, cannot be read or
parsed is reported and ignored: the door then starts knowing nobody, as it did before.
A ``proved_at`` in the future (the wall clock behind the one that wrote it: a restored
VM, a node whose clock lags) counts as proven now: believing it costs at most
:data:`KNOWN_S` of first turns to an address that did prove a credential, where
dropping it made the whole fleet new again. The document is made in a thread from a
copy of the entries (65,536 of them took the loop 171 ms).

What one credential buys is bounded: at most :data:`SUBJECT_MOST` addresses a subject,
its least recently proven forgotten first, never another subject's. Forgetting an
address whose known turn bought nothing (its connection ended neither proven nor past
its handshake) was tried and not kept: under a flood with no token, a restarted hub's
spokes displaced before the server's first flight reached them were forgotten too, and
a few then stayed out until the flood ended (the thirty-fifth probe: all 500 back after
31-33 s in 3 runs of 5, against 7-12 s). What is kept instead is softer: how many
handshake turns an address has had that its connections' proofs did not pay for
(:meth:`KnownHosts.spend`, :meth:`KnownHosts.standing`; a connection's first proof pays
:data:`PROOF_CREDIT`), by which the turns put the addresses whose turns bought nothing
behind those whose turns did (:mod:`strata_local.handshakes`); an address is never
forgotten for it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from strata_local.atomic import write_atomic

log = logging.getLogger(__name__)

KNOWN_S = 3600.0
"""How long an address that proved a credential has its turns first, seconds."""

KNOWN_MOST = 65536
"""Most addresses remembered as known (the least recently proven are forgotten first)."""

PROOF_CREDIT = 2
"""Turns spent unproven that a connection's first proof takes off its address's count
(:meth:`KnownHosts.add`): its own turn and one more, so a spoke whose try failed is back
in the first rank after its next try proves, and a flood buys one turn of that rank per
connection it proves (a TLS handshake and a call with the token), not a whole rank."""

SUBJECT_MOST = 4096
"""Most addresses remembered as known for one subject (its least recently proven are
forgotten first): from how many addresses one token's holder can flood with the known
callers' turns, however many it proved a call from (issue 39's thirty-fourth probe:
20,000, and a restarted hub's fleet, sharing its token, back at +33 s, not +8 s). Twice
the hub's connection slots: a fleet larger than this loses the turns of its least
recently active spokes only, which then take theirs as new callers do."""

SAVE_EVERY_S = 30.0
"""How often a server writes its known addresses to its data directory, seconds (when
they changed): a spoke that first proved itself less than this before a crash is new
again."""

FORMAT = 1
"""The file's format (``"format"``); another is ignored."""

LOAD_MOST_BYTES = 16 << 20
"""Largest file :meth:`KnownHosts.load` reads (65,536 entries take about 5 MiB)."""

NAME_MOST = 256
"""Longest address or subject a file's entry may hold, characters (an IPv6 address with
its zone takes about 60; a token's subject is a short name)."""

ENCODE_STEP = 1024
"""Entries a writer encodes at a time (the GIL is held for each piece, about 1 ms)."""

Entry = tuple[str, str, float]
"""An address, whose credential it proved (the subject), and when (the clock's seconds)."""


class KnownHosts:
    """Addresses that proved a credential lately, and whose (the token's subject, say):
    at most ``most``, each for ``keep_s``.

    Args:
        most: Most addresses remembered.
        subject_most: Most addresses remembered for one subject.
        keep_s: Seconds an address is remembered after it last proved one (None:
            :data:`KNOWN_S` as it is when made).
        clock: Monotonic seconds.
        wall: Unix seconds (for :meth:`save` and :meth:`load` only).

    Attributes:
        changes: How many times :meth:`add` was called (a saver writes when it moved).

    Not thread-safe: one event loop owns it (the savers copy it there first).
    """

    def __init__(
        self,
        most: int = KNOWN_MOST,
        subject_most: int = SUBJECT_MOST,
        keep_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.most, self.subject_most, self._clock, self._wall = most, subject_most, clock, wall
        self.keep_s = KNOWN_S if keep_s is None else keep_s
        self._proved: collections.OrderedDict[str, tuple[float, str]] = collections.OrderedDict()
        self._subjects: dict[str, collections.OrderedDict[str, None]] = {}  # least recent first
        self._spent: dict[str, int] = {}  # a known address's turns its proofs did not pay for
        self.changes = 0

    def add(self, host: str, subject: str, credit: int = 0) -> None:
        """``host`` (a caller's address) proved ``subject``'s credential now; ``credit``
        turns come off its count of turns spent unproven (:data:`PROOF_CREDIT` for a
        connection's first proof, none for a proven one still in use: the thirty-seventh
        probe kept a flood's addresses first by proving from them again, 60 times a
        second, while any proof set the count to none). The count stays when the
        address proves another subject's credential."""
        spent = self._spent.get(host, 0)
        self._remember(host, self._clock(), subject)
        if spent > credit:
            self._spent[host] = spent - credit
        else:
            self._spent.pop(host, None)
        self.changes += 1

    def spend(self, host: str) -> None:
        """``host``, a known address, had a handshake's turn (nothing if it is not known):
        counted until its connections' proofs pay for it (:meth:`add`)."""
        if host in self._proved:
            self._spent[host] = self._spent.get(host, 0) + 1

    def standing(self, host: str) -> tuple[str, int] | None:
        """Whose credential ``host`` proved within :attr:`keep_s`, and how many
        handshake turns it has had that its proofs did not pay for (:meth:`spend`);
        None: it proved none."""
        subject = self.subject(host)
        return None if subject is None else (subject, self._spent.get(host, 0))

    def subject(self, host: str) -> str | None:
        """Whose credential ``host`` proved within :attr:`keep_s`; None: none."""
        proved = self._proved.get(host)
        if proved is None:
            return None
        if self._clock() - proved[0] > self.keep_s:
            self._forget(host)
            return None
        return proved[1]

    def __contains__(self, host: object) -> bool:
        return isinstance(host, str) and self.subject(host) is not None

    def __len__(self) -> int:
        """How many addresses proved a credential within :attr:`keep_s` (those longer
        ago are forgotten now: ``strata_hub_known_callers`` counts no departed fleet)."""
        now = self._clock()
        while self._proved:  # least recently proven first: forgotten from the front
            host, (at, _) = next(iter(self._proved.items()))
            if now - at <= self.keep_s:
                break
            self._forget(host)
        return len(self._proved)

    def save(self, path: Path) -> int:
        """Writes the addresses proven within :attr:`keep_s` to ``path`` (see the
        module), whole or not at all; returns how many.

        Raises:
            OSError: It could not be written (nothing is left behind).
        """
        return _write(path, *self._snapshot())

    async def save_every(self, path: Path, every_s: float = SAVE_EVERY_S) -> None:
        """Saves to ``path`` every ``every_s`` seconds when :meth:`add` was called since
        (the file made and written in a thread; one that cannot be written is logged and
        tried again next time), until cancelled. A write under way when it is cancelled
        finishes first, so a :meth:`save` after awaiting the cancelled task is the last
        word. A server runs it as a task and calls :meth:`save` once more as it stops."""
        saved = self.changes
        while True:
            await asyncio.sleep(every_s)
            if self.changes == saved:
                continue
            saved = self.changes
            writing = asyncio.ensure_future(asyncio.to_thread(_write, path, *self._snapshot()))
            try:
                await asyncio.shield(writing)
            except asyncio.CancelledError:
                await asyncio.gather(writing, return_exceptions=True)
                raise
            except OSError as err:
                log.warning("known callers not saved to %s: %s", path, err)

    def _snapshot(self) -> tuple[list[tuple[str, tuple[float, str]]], float, float, float]:
        """A copy of the entries (address, (monotonic seconds, subject)), made on the
        loop for a writer (at C speed: the writer drops what is older than
        :attr:`keep_s`), with the monotonic and the wall clock now and :attr:`keep_s`."""
        return list(self._proved.items()), self._clock(), self._wall(), self.keep_s

    def load(self, path: Path) -> int:
        """Adds the addresses ``path`` holds that proved a credential within
        :attr:`keep_s` (as long ago as the file says, by the wall clock; one in the
        future, now); returns how many it read (the least recent beyond :attr:`most`
        and :attr:`subject_most` are then forgotten again). A missing file adds none;
        one that is not a regular file of this user's, cannot be read, or is not this
        format is logged and ignored (the caller starts knowing nobody, as a new server
        does)."""
        try:
            data = _read(path)
        except FileNotFoundError:
            return 0
        except OSError as err:
            log.warning("known callers not read from %s: %s", path, err)
            return 0
        try:
            entries = _parse(json.loads(data))
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            log.warning("known callers not read from %s: %s", path, err)
            return 0
        now, wall, added = self._clock(), self._wall(), 0
        for host, subject, proved_at in entries:
            age = max(0.0, wall - proved_at)  # from the future: proven now
            if age <= self.keep_s and host not in self._proved:
                self._remember(host, now - age, subject)
                added += 1
        return added

    def _remember(self, host: str, at: float, subject: str) -> None:
        """``host`` proved ``subject``'s credential at ``at``: the most recent of all and
        of its subject's, the least recent forgotten beyond :attr:`most` and
        :attr:`subject_most`."""
        before = self._proved.get(host)
        if before is not None and before[1] != subject:
            self._forget(host)
        self._proved[host] = (at, subject)
        self._proved.move_to_end(host)
        mine = self._subjects.setdefault(subject, collections.OrderedDict())
        mine[host] = None
        mine.move_to_end(host)
        while len(mine) > self.subject_most:
            self._forget(next(iter(mine)))
        while len(self._proved) > self.most:
            self._forget(next(iter(self._proved)))

    def _forget(self, host: str) -> None:
        _, subject = self._proved.pop(host)
        self._spent.pop(host, None)
        mine = self._subjects[subject]
        del mine[host]
        if not mine:
            del self._subjects[subject]


def _write(
    path: Path,
    entries: list[tuple[str, tuple[float, str]]],
    now: float,
    wall: float,
    keep_s: float,
) -> int:
    """Writes the ``entries`` (address, (proven at monotonic seconds, subject)) proven
    within ``keep_s`` of ``now`` (``wall`` Unix seconds) to ``path`` as the module says;
    returns how many.

    Raises:
        OSError: It could not be written (nothing is left behind).
    """
    hosts = [
        [host, subject, round(wall - (now - at), 3)]
        for host, (at, subject) in entries
        if now - at <= keep_s
    ]
    # in pieces: json's C encoder holds the GIL for all it is given (65,536 entries at once
    # kept the event loop waiting 51-57 ms; in pieces, 17-28), between pieces the loop may run
    pieces = [
        json.dumps(hosts[i : i + ENCODE_STEP])[1:-1] for i in range(0, len(hosts), ENCODE_STEP)
    ]
    document = f'{{"format": {FORMAT}, "hosts": [{", ".join(pieces)}]}}'
    write_atomic(path, document.encode())
    return len(hosts)


def _read(path: Path) -> bytes:
    """``path``'s bytes, if it is a regular file of this user's, at most
    :data:`LOAD_MOST_BYTES`: never a link followed, never a FIFO or device waited on.

    Raises:
        FileNotFoundError: There is none.
        OSError: It cannot be read, or is something else (a link, a FIFO, another
            user's, too large).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise OSError(f"{path} is not a regular file")
        if status.st_uid != os.geteuid():
            raise OSError(f"{path} belongs to uid {status.st_uid}, not this user")
        if status.st_size > LOAD_MOST_BYTES:
            raise OSError(f"{path} is larger than {LOAD_MOST_BYTES} bytes")
        with os.fdopen(fd, "rb", closefd=False) as stream:
            return stream.read(LOAD_MOST_BYTES)
    finally:
        os.close(fd)


def _parse(document: object) -> list[Entry]:
    """The ``hosts`` of a known-callers file, checked.

    Raises:
        ValueError: It is not format :data:`FORMAT`, or an entry is not
            ``[address, subject, seconds]`` with names of at most :data:`NAME_MOST`.
    """
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"not a known-callers file of format {FORMAT}")
    entries = document.get("hosts")
    if not isinstance(entries, list):
        raise ValueError("its hosts are not a list")
    hosts: list[Entry] = []
    for entry in entries:
        if (
            not isinstance(entry, list)
            or len(entry) != 3
            or not isinstance(entry[0], str)
            or not isinstance(entry[1], str)
            or not 0 < len(entry[0]) <= NAME_MOST
            or len(entry[1]) > NAME_MOST
            or isinstance(entry[2], bool)
            or not isinstance(entry[2], int | float)
        ):
            raise ValueError(f"an entry is not [address, subject, seconds]: {entry!r:.80}")
        hosts.append((entry[0], entry[1], float(entry[2])))
    return hosts
