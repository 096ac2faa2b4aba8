"""Which files of a snapshot a request means: validated globs (prewarm, pin) and
validated exact paths (hints).

A glob is matched against manifest paths (``/``-separated, relative to the snapshot root)
with :func:`fnmatch.fnmatchcase`'s rules (``*`` also crosses ``/``); a glob that names a
directory selects everything under it. A hint names files exactly, as the manifest spells
them.

What one request may make the daemon hold and do is bounded (a fresh probe's findings):
at most :data:`MAX_GLOB_TOTAL_CHARS` characters of globs (they are kept with the pin or job),
at most :data:`MAX_WILDCARD_GLOBS` of them with a wildcard, and at most
:data:`MAX_MATCH_WORK` files × wildcard globs to match. A :class:`GlobMatcher` is compiled
per request and dropped with it: :func:`fnmatch.fnmatchcase` keeps every pattern it ever
compiled in a process-wide cache of 32,768, which distinct 4 KiB globs grew to 2.3 GiB.
Globs without a wildcard are a set looked up once per directory level of a path, whatever
their number. Matching is meant for a worker thread: it touches nothing shared.
"""

from __future__ import annotations

import fnmatch
import re
import time
from array import array
from collections.abc import Iterable, Sequence

from protocol.hub.v1 import hub_pb2
from spoke.cache.hintplan import HintPlan, PlanBuilder
from spoke.errors import InvalidRequest

MAX_GLOBS = 10_000
"""Most globs (or hint paths) in one request."""

MAX_GLOB_CHARS = 4096
"""Longest glob or path, characters (Linux's ``PATH_MAX``)."""

MAX_GLOB_TOTAL_CHARS = 65_536
"""Most characters of globs in one prewarm or pin request (they are kept with the
pin or job: 1,000 pins hold at most 64 MiB of them)."""

MAX_WILDCARD_GLOBS = 64
"""Most globs with a wildcard (``*``, ``?``, ``[``) in one request; each is a regular
expression tried on every file (a CPython ``re`` match, about 0.4 µs here)."""

MAX_MATCH_WORK = 10_000_000
"""Most files × wildcard globs one request may ask to match, refused before matching starts
(a glob without a wildcard costs nothing per glob). A first bound only: a match costs 0.4 µs
for ``train/*.tar`` but 40 µs for ``*`` and 26 character classes (the eleventh probe), so
:data:`MATCH_BUDGET_S` is what bounds the time."""

MATCH_BUDGET_S = 2.0
"""Longest one request's globs may take to match a manifest, seconds (wall clock, checked
every :data:`MATCH_CHECK_EVERY` files): a request that takes longer is refused, and its
worker thread stops."""

MATCH_CHECK_EVERY = 256
"""Files matched between two looks at the clock."""

_WILDCARD = re.compile(r"[*?\[]")


def validate_globs(globs: Sequence[str]) -> list[str]:
    """Check globs from an untrusted request; ``[]`` means everything (``["*"]``).

    Raises:
        InvalidRequest: too many, too many characters in all, empty, absolute, with a
            ``..`` component, a NUL, or too long.
    """
    if len(globs) > MAX_GLOBS:
        raise InvalidRequest(f"too many paths: {len(globs)} (at most {MAX_GLOBS})")
    total = 0
    for glob in globs:
        if not glob or not glob.strip():
            raise InvalidRequest("empty path glob")
        if len(glob) > MAX_GLOB_CHARS:
            raise InvalidRequest(f"path glob longer than {MAX_GLOB_CHARS} characters")
        if "\0" in glob:
            raise InvalidRequest("path glob contains NUL")
        if glob.startswith("/"):
            raise InvalidRequest(
                f"path glob {short(glob)!r} is absolute; paths are relative to the snapshot root"
            )
        if ".." in glob.split("/"):
            raise InvalidRequest(f"path glob {short(glob)!r} contains '..'")
        total += len(glob)
    if total > MAX_GLOB_TOTAL_CHARS:
        raise InvalidRequest(
            f"path globs of {total:,} characters in all (at most {MAX_GLOB_TOTAL_CHARS:,}): "
            "name a directory or use a wildcard instead of listing every file"
        )
    return list(globs) or ["*"]


def short(text: str, most: int = 80) -> str:
    """``text`` cut to ``most`` characters for a message (``…`` marks a cut)."""
    return text if len(text) <= most else text[: most - 1] + "…"


PREVIEW_CHARS = 1024
"""Characters of globs a pin or prewarm job keeps of its request (``paths``; how many globs
there were is ``paths_total``): what it holds is its blocks, the globs are for people."""


def preview(globs: Sequence[str], most: int = PREVIEW_CHARS) -> list[str]:
    """The first of ``globs`` that fit in ``most`` characters (always the first one, cut
    with ``…`` when it alone is longer)."""
    kept: list[str] = []
    used = 0
    for glob in globs:
        if used + len(glob) > most:
            if not kept:
                kept.append(short(glob, most))
            break
        kept.append(glob)
        used += len(glob)
    return kept


def describe(globs: Sequence[str]) -> str:
    """A few of ``globs`` for a message: the first three, and how many more."""
    shown = ", ".join(repr(short(g)) for g in globs[:3])
    return f"[{shown}{f', … {len(globs) - 3} more' if len(globs) > 3 else ''}]"


class GlobMatcher:
    """One request's globs, compiled for matching many paths.

    Args:
        globs: validated globs (:func:`validate_globs`).

    Raises:
        InvalidRequest: more than :data:`MAX_WILDCARD_GLOBS` globs have a wildcard.
    """

    def __init__(self, globs: Sequence[str]) -> None:
        literal = [g for g in globs if not _WILDCARD.search(g)]
        wild = [g for g in globs if _WILDCARD.search(g)]
        if len(wild) > MAX_WILDCARD_GLOBS:
            raise InvalidRequest(
                f"{len(wild)} path globs with a wildcard (at most {MAX_WILDCARD_GLOBS})"
            )
        self.everything = "*" in wild  # "*" matches every path
        self._exact = frozenset(literal)  # a file's own path
        self._dirs = frozenset(g.rstrip("/") for g in literal)  # a directory it lies under
        # the glob itself, or a directory it names: everything under it ("glob/*")
        self._wild = [
            re.compile(f"(?:{fnmatch.translate(g)}|{fnmatch.translate(g.rstrip('/') + '/*')})")
            for g in wild
        ]

    @property
    def wildcards(self) -> int:
        """How many globs are tried on every path (0 when one is ``*``)."""
        return 0 if self.everything else len(self._wild)

    def check_work(self, files: int, what: str) -> None:
        """Refuse matching ``files`` paths when that is more than :data:`MAX_MATCH_WORK`.

        Raises:
            InvalidRequest: too many files × wildcard globs.
        """
        if files * self.wildcards > MAX_MATCH_WORK:
            raise InvalidRequest(
                f"{self.wildcards} path globs with a wildcard over the {files:,} files of "
                f"{what} are too much to match (files × globs at most {MAX_MATCH_WORK:,}): "
                "use fewer wildcard globs, or directories and exact paths"
            )

    def match(self, path: str) -> bool:
        """Whether ``path`` matches a glob or lies under a directory that matches one."""
        if self.everything:
            return True
        if path in self._exact:
            return True
        dirs = self._dirs
        if dirs:
            at = path.find("/")
            while at != -1:
                if path[:at] in dirs:
                    return True
                at = path.find("/", at + 1)
        return any(pattern.match(path) for pattern in self._wild)


def select(
    entries: Iterable[hub_pb2.ManifestEntry],
    globs: Sequence[str] | GlobMatcher,
    budget_s: float | None = None,
    what: str = "the snapshot",
) -> list[hub_pb2.ManifestEntry]:
    """Regular files whose path matches a glob or lies under a directory matching one.

    Args:
        entries: the manifest.
        globs: validated globs, or a matcher of them.
        budget_s: longest the matching may take, seconds (None: no limit).
        what: the snapshot, for messages (e.g. ``ds@v1``).

    Raises:
        InvalidRequest: ``globs`` are too many wildcards (:class:`GlobMatcher`), or matching
            them took more than ``budget_s``.
    """
    matcher = globs if isinstance(globs, GlobMatcher) else GlobMatcher(globs)
    file = hub_pb2.ENTRY_TYPE_FILE
    if budget_s is None:
        return [e for e in entries if e.type == file and matcher.match(e.path)]
    end = time.monotonic() + budget_s
    chosen = []
    for n, entry in enumerate(entries, 1):
        if entry.type == file and matcher.match(entry.path):
            chosen.append(entry)
        if n % MATCH_CHECK_EVERY == 0 and time.monotonic() > end:
            raise InvalidRequest(
                f"matching {matcher.wildcards} path globs with a wildcard against the files "
                f"of {what} took more than {budget_s:g} s ({n:,} files matched): use fewer "
                "or simpler wildcard globs, or directories and exact paths"
            )
    return chosen


def unique_blocks(entries: Iterable[hub_pb2.ManifestEntry]) -> dict[str, int]:
    """Every distinct block of ``entries``: digest → size (bytes), in first-seen order."""
    out: dict[str, int] = {}
    for entry in entries:
        for block in entry.blocks:
            out.setdefault(block.digest, block.size)
    return out


def _exact_path(path: str) -> str:
    """Checks a hint's path: relative, no empty, ``.`` or ``..`` part, no NUL.

    Raises:
        InvalidRequest: it is not such a path.
    """
    if path.startswith("/"):
        raise InvalidRequest(f"path {path!r} is absolute; paths are relative to the snapshot root")
    if "\0" in path or any(part in ("", ".", "..") for part in path.split("/")):
        raise InvalidRequest(
            f"path {path!r} is not a plain relative path (empty, '.' or '..' part)"
        )
    return path


def hint_plan(
    entries: Iterable[hub_pb2.ManifestEntry],
    paths: Sequence[str],
    what: str,
    builder: PlanBuilder,
) -> HintPlan:
    """The blocks of the files ``paths`` names, in that order (a file read twice is
    planned twice), as a compact :class:`~spoke.cache.hintplan.HintPlan` built within
    ``builder``'s limits; each distinct path is looked up once (a job re-reading files
    repeats them), and nothing per position is a Python object. Meant for a worker thread:
    it touches nothing shared.

    Args:
        entries: the snapshot's manifest.
        paths: exact file paths, relative to the snapshot root.
        what: the snapshot, for messages (e.g. ``ds@v1``).
        builder: collects the plan (and enforces its limits).

    Raises:
        InvalidRequest: a path is absolute, has an empty, ``.`` or ``..`` component or a
            NUL, or is not a regular file of the snapshot.
        PlanLimit: the plan would pass one of ``builder``'s limits.
    """
    files = {e.path: e for e in entries if e.type == hub_pb2.ENTRY_TYPE_FILE}
    seen: dict[str, array[int]] = {}
    for path in paths:
        codes = seen.get(path)
        if codes is None:
            entry = files.get(_exact_path(path))
            if entry is None:
                raise InvalidRequest(f"{path!r} is not a file of {what}")
            codes = array("i", [builder.code(b.digest, b.size) for b in entry.blocks])
            seen[path] = codes
        builder.extend(codes)
    del files, seen
    return builder.build()
