"""Per-dataset UNIX groups at the mount (``--dataset-groups``): which local users may enter
``MOUNT/<dataset>``.

``--dataset-groups 'team-a*=strata-team-a,team-b=1002'`` maps dataset-name globs
(:func:`fnmatch.fnmatchcase`) to groups, each a name of the group database or a number.
With any rule, the mount shows every dataset directory owned by root, of the first
matching rule's group (root's, 0, where none matches: deny by default), mode 0550, and
the kernel (``default_permissions``) lets in root and that group's members only; nothing
below a dataset directory changes. Without rules nothing changes at all.

Names are resolved to numbers once, when the settings are validated (:func:`resolve`), so
the mount processes a supervisor starts, which validate the settings file again, never
look a name up themselves, and succession compares numbers.
"""

from __future__ import annotations

import fnmatch
import grp
import stat
from collections.abc import Iterable

__all__ = ["DATASET_DIR_MODE", "DatasetGroups", "resolve", "split"]

DATASET_DIR_MODE = stat.S_IFDIR | 0o550
"""A dataset directory's mode with rules (dr-xr-x---: root and the group enter it)."""

MAX_GID = 2**32 - 2  # (gid_t)-1 means "no change" to chown(2)

FLAG = "--dataset-groups"


def split(value: str) -> tuple[str, ...]:
    """``"a*=g1, b=g2"`` → ``("a*=g1", "b=g2")`` (empty items dropped: ``""`` is no rule)."""
    return tuple(item.strip() for item in value.split(",") if item.strip())


def _gid(group: str) -> int:
    if group.isdigit():
        gid = int(group)
        if gid > MAX_GID:
            raise ValueError(f"{FLAG}: gid {gid} is out of range")
        return gid
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(
            f"{FLAG}: no group {group!r} on this host (GLOB=GROUP: a group name or gid)"
        ) from None


def resolve(rules: Iterable[str]) -> tuple[str, ...]:
    """``GLOB=GROUP`` rules with each group as its number (``GLOB=GID``), in their order.

    Raises:
        ValueError: a rule is not ``GLOB=GROUP``, or names a group this host does not know.
    """
    out = []
    for rule in rules:
        glob, sep, group = rule.strip().rpartition("=")
        glob, group = glob.strip(), group.strip()
        if not sep or not glob or not group:
            raise ValueError(f"{FLAG}: {rule!r} is not GLOB=GROUP (e.g. 'team-a*=strata-team-a')")
        out.append(f"{glob}={_gid(group)}")
    return tuple(out)


class DatasetGroups:
    """The group of each dataset directory under resolved rules (:func:`resolve`)."""

    def __init__(self, rules: Iterable[str]) -> None:
        self.rules = [(glob, int(gid)) for glob, _, gid in (r.rpartition("=") for r in rules)]
        self._gids: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self.rules)

    def gid(self, dataset: str) -> int:
        """The group of ``MOUNT/<dataset>``: the first matching rule's, else root's (0)."""
        gid = self._gids.get(dataset)
        if gid is None:
            matched = (g for glob, g in self.rules if fnmatch.fnmatchcase(dataset, glob))
            gid = self._gids[dataset] = next(matched, 0)
        return gid
