"""Naming rules for datasets, tags, versions and block digests.

Dataset and tag names become directory names under the spoke's mount
(``MOUNT/<dataset>/<tag>``), so they are restricted to a small, path-safe alphabet:
``[a-z0-9][a-z0-9._-]{0,63}`` (1 to 64 characters, no ``/``, no NUL, never ``.`` or
``..``, never a leading dot). Versions are named ``v1``, ``v2``, … (``v[1-9][0-9]*``);
a tag may not look like a version (``v`` followed only by digits), so a reference is
never ambiguous. A block digest is an xxh3-128 hex digest: exactly 32 lowercase hex
characters (xxHash spec, https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md).
"""

from __future__ import annotations

import re

from hub.errors import InvalidDigest, InvalidName

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
VERSION_PATTERN = re.compile(r"v[1-9][0-9]*")
VERSION_LIKE_PATTERN = re.compile(r"v[0-9]+")
DIGEST_PATTERN = re.compile(r"[0-9a-f]{32}")

MAX_VERSION = 2**32 - 1
"""Highest version number; versions are stored as unsigned 32-bit integers."""


def _shown(value: str) -> str:
    """A bounded, quoted rendering of user input for error messages."""
    return repr(value if len(value) <= 80 else value[:77] + "...")


def validate_dataset(name: str) -> str:
    """Checks a dataset name.

    Args:
        name: The candidate name, e.g. ``"f3"``.

    Returns:
        The name, unchanged.

    Raises:
        InvalidName: The name does not match ``[a-z0-9][a-z0-9._-]{0,63}``.
    """
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidName(
            f"invalid dataset name {_shown(name)}: "
            "use 1-64 characters from a-z 0-9 . _ -, starting with a letter or digit"
        )
    return name


def validate_tag(name: str) -> str:
    """Checks a tag name.

    Args:
        name: The candidate tag, e.g. ``"latest"``.

    Returns:
        The name, unchanged.

    Raises:
        InvalidName: The name does not match ``[a-z0-9][a-z0-9._-]{0,63}`` or looks like
            a version (``v`` followed only by digits, e.g. ``v2`` or ``v01``).
    """
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidName(
            f"invalid tag name {_shown(name)}: "
            "use 1-64 characters from a-z 0-9 . _ -, starting with a letter or digit"
        )
    if VERSION_LIKE_PATTERN.fullmatch(name):
        raise InvalidName(f"invalid tag name {_shown(name)}: a tag may not look like a version")
    return name


def is_version(ref: str) -> bool:
    """Tells whether a reference names a version (``v[1-9][0-9]*``) rather than a tag.

    Args:
        ref: A version or tag name.

    Returns:
        True when ``ref`` is a well-formed version name.
    """
    return VERSION_PATTERN.fullmatch(ref) is not None and int(ref[1:]) <= MAX_VERSION


def version_name(number: int) -> str:
    """Formats a version number.

    Args:
        number: The version number, 1 to 2**32-1.

    Returns:
        The version name, e.g. ``"v3"``.

    Raises:
        ValueError: ``number`` is out of range (a programming error, not user input).
    """
    if not 1 <= number <= MAX_VERSION:
        raise ValueError(f"version number out of range: {number}")
    return f"v{number}"


def version_number(name: str) -> int:
    """Parses a version name.

    Args:
        name: A version name such as ``"v3"``.

    Returns:
        The version number, e.g. 3.

    Raises:
        InvalidName: ``name`` is not a well-formed version name.
    """
    if not is_version(name):
        raise InvalidName(f"invalid version {_shown(name)}: versions are named v1, v2, ...")
    return int(name[1:])


def validate_ref(ref: str) -> str:
    """Checks a reference: a version name or a tag name.

    Args:
        ref: ``"v3"`` or ``"latest"``.

    Returns:
        The reference, unchanged.

    Raises:
        InvalidName: ``ref`` is neither a well-formed version nor a valid tag name.
    """
    if is_version(ref):
        return ref
    if not NAME_PATTERN.fullmatch(ref) or VERSION_LIKE_PATTERN.fullmatch(ref):
        raise InvalidName(
            f"invalid reference {_shown(ref)}: expected a version (v1, v2, ...) or a tag name"
        )
    return ref


def validate_digest(digest: str) -> str:
    """Checks a block digest.

    Args:
        digest: The candidate digest.

    Returns:
        The digest, unchanged.

    Raises:
        InvalidDigest: ``digest`` is not exactly 32 lowercase hex characters.
    """
    if not DIGEST_PATTERN.fullmatch(digest):
        raise InvalidDigest(
            f"malformed block digest {_shown(digest)}: expected 32 lowercase hex characters"
        )
    return digest


def note_name(name: str) -> str:
    """``name`` if it can be a note: not a blob's digest or shard, no path."""
    if not name or "/" in name or name.startswith(".") or DIGEST_PATTERN.fullmatch(name):
        raise ValueError(f"not a note name: {name!r}")
    if len(name) == 2:
        raise ValueError(f"a note name of two characters would be a shard: {name!r}")
    return name
