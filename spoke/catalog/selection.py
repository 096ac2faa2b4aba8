"""Which files of a snapshot a request means: validated globs (prewarm, pin, evict) and
validated exact paths (hints).

A glob is matched against manifest paths (``/``-separated, relative to the snapshot root)
with :func:`fnmatch.fnmatchcase` (``*`` also crosses ``/``); a glob that names a directory
selects everything under it. A hint names files exactly, as the manifest spells them.
"""

from __future__ import annotations

import fnmatch
from array import array
from collections.abc import Iterable, Sequence

from protocol.hub.v1 import hub_pb2
from spoke.cache.hintplan import HintPlan, PlanBuilder
from spoke.errors import InvalidRequest

MAX_GLOBS = 10_000
MAX_GLOB_CHARS = 4096


def validate_globs(globs: Sequence[str]) -> list[str]:
    """Check globs from an untrusted request; ``[]`` means everything (``["*"]``).

    Raises:
        InvalidRequest: too many, empty, absolute, with a ``..`` component, a NUL, or too long.
    """
    if len(globs) > MAX_GLOBS:
        raise InvalidRequest(f"too many paths: {len(globs)} (at most {MAX_GLOBS})")
    for glob in globs:
        if not glob or not glob.strip():
            raise InvalidRequest("empty path glob")
        if len(glob) > MAX_GLOB_CHARS:
            raise InvalidRequest(f"path glob longer than {MAX_GLOB_CHARS} characters")
        if "\0" in glob:
            raise InvalidRequest("path glob contains NUL")
        if glob.startswith("/"):
            raise InvalidRequest(
                f"path glob {glob!r} is absolute; paths are relative to the snapshot root"
            )
        if ".." in glob.split("/"):
            raise InvalidRequest(f"path glob {glob!r} contains '..'")
    return list(globs) or ["*"]


def select(
    entries: Iterable[hub_pb2.ManifestEntry], globs: Sequence[str]
) -> list[hub_pb2.ManifestEntry]:
    """Regular files whose path matches a glob or lies under a directory matching one."""
    chosen = []
    for entry in entries:
        if entry.type != hub_pb2.ENTRY_TYPE_FILE:
            continue
        for glob in globs:
            if fnmatch.fnmatchcase(entry.path, glob) or fnmatch.fnmatchcase(
                entry.path, glob.rstrip("/") + "/*"
            ):
                chosen.append(entry)
                break
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
