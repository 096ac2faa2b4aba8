"""Where a snapshot's symlinks lead, resolved as the kernel resolves them on a mount.

A spoke shows a snapshot as a directory, ``MOUNT/<dataset>/<version>/``, and the kernel
follows its symlinks there: a target that climbs above that directory (``..`` from its
root) reaches other versions and, from the mount's own parent, anything on the node. Judging
a target by its text (:func:`hub.publish.walk.leaves_tree`) misses a climb through other links of
the snapshot: with ``q -> .``, the target ``q/q/../../etc/shadow`` looks as if it stays
inside, but each ``q`` resolves to the root, so the two ``..`` climb out of it.

So :func:`escape` walks a target the way path resolution does (path_resolution(7)), over
the snapshot's own manifest and nothing else: one component at a time from the link's
directory; ``.`` stays, ``..`` goes back to the directory it came from (the real one,
after links, as the kernel does) and leaving the root there is refused; a symlink of the
snapshot is followed (its own target spliced in front of what is left, relative to the
directory holding it), at most :data:`MAX_LINKS` of them in all (Linux's limit; more is
refused as a loop, which never resolves anyway); an absolute target is refused wherever it
is met. The walk stops, and the link is allowed, where the kernel would stop without
having left: a component that does not exist (a dangling link, which stays dangling: the
snapshot never changes) or that is a file with more to follow (``ENOTDIR``).
"""

from __future__ import annotations

from collections.abc import Callable

from hub.snapshot.manifest import MAX_NAME_BYTES, EntryType

MAX_LINKS = 40
"""Most symlinks one resolution follows, the first included: Linux's ``MAXSYMLINKS``
(path_resolution(7); ``include/linux/namei.h``). Beyond it the kernel answers ``ELOOP``."""

Lookup = Callable[[str], tuple[EntryType, str] | None]
"""The snapshot's entry at a manifest path, as ``(type, symlink target)``, or None."""


def escape(path: str, target: str, lookup: Lookup) -> str | None:
    """Why following the symlink at ``path`` would leave the snapshot, or None.

    Args:
        path: The link's manifest path.
        target: Its target, as ``readlink`` gave it.
        lookup: The snapshot's entries by path (:data:`Lookup`).

    Returns:
        None when every step stays inside the tree (including a target that never
        resolves: dangling, or through a file); else the reason, one phrase naming the
        step: an absolute target, a ``..`` above the root, or more than
        :data:`MAX_LINKS` links.
    """
    if target.startswith("/"):
        return "is absolute"
    current = path.split("/")[:-1]  # the link's directory, as components from the root
    pending = _components(target)
    links = 1
    while pending:
        part = pending.pop()
        if part == ".":
            continue
        if part == "..":
            if not current:
                followed = f" after following {links - 1} of its symlinks" if links > 1 else ""
                return f"climbs above the snapshot's root{followed}"
            current.pop()
            continue
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            return None  # ENAMETOOLONG: never resolves
        found = lookup("/".join([*current, part]))
        if found is None:
            return None  # dangling here, and for good: the snapshot never changes
        kind, link_target = found
        if kind == EntryType.DIRECTORY:
            current.append(part)
        elif kind == EntryType.FILE:
            return None  # the end, or ENOTDIR for anything after it
        else:
            links += 1
            if links > MAX_LINKS:
                return f"does not resolve within {MAX_LINKS} symlinks (a loop)"
            if link_target.startswith("/"):
                return f"passes through {'/'.join([*current, part])!r}, which is absolute"
            pending.extend(_components(link_target))
    return None


def _components(target: str) -> list[str]:
    """``target``'s components as a stack (the first on top), empty ones dropped."""
    return [part for part in reversed(target.split("/")) if part]
