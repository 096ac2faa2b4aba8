"""A set of block digests with their sizes, in arrays: about 30 bytes a block, not 200.

Background fill keeps, for each snapshot the mount loaded, its distinct blocks and their
sizes (:class:`spoke.catalog.snapshots.IndexedSnapshot`), and asks of every block read
which loaded snapshots hold it. A ``dict`` of hex digest → size cost about 200 bytes a
block (the 81-byte string, its slot, the int); :class:`DigestSizes` keeps each digest's 16
raw bytes in one ``bytearray`` and its size in an ``array``, in first-seen order, and finds
a digest by open addressing on its first 8 bytes (digests are uniform hashes, so those
bytes are a good hash already).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping
from typing import Final

DIGEST_BYTES: Final = 16
_EMPTY: Final = 0  # a free slot; a used one holds index + 1


class DigestSizes(Mapping[str, int]):
    """Distinct block digests → size (bytes), in the order first added; a read-only
    ``Mapping`` once built.

    Storage: ``raw`` (16 bytes a digest), ``sizes`` (u32 a digest) and a slot table
    (u32, at least twice as many slots as digests): 24–32 bytes a digest. A digest that is
    not 32 lowercase hex characters (never the case for a checked manifest) is kept as
    given in a small dict, so every key handed out is the one added.
    """

    def __init__(self) -> None:
        self._raw = bytearray()
        self._sizes = array("I")
        self._slots = array("I", bytes(4 * 16))
        self._odd: dict[str, int] = {}  # odd digest -> index
        self._odd_at: dict[int, str] = {}  # index -> odd digest

    def add(self, digest: str, size: int) -> bool:
        """Add ``digest`` of ``size`` bytes unless present (its first size is kept);
        True when it was new."""
        raw = _raw(digest)
        index = len(self._sizes)
        if raw is None:  # kept as given; its raw bytes are a placeholder, in no slot
            if digest in self._odd:
                return False
            self._odd[digest], self._odd_at[index] = index, digest
            self._raw += bytes(DIGEST_BYTES)
            self._sizes.append(size)
            return True
        slot = self._slot(raw)
        if self._slots[slot] != _EMPTY:
            return False
        self._raw += raw
        self._sizes.append(size)
        self._slots[slot] = index + 1
        if 2 * len(self._sizes) > len(self._slots):
            self._grow()
        return True

    def _slot(self, raw: bytes) -> int:
        """The slot holding ``raw``, or the free slot where it would go."""
        slots, stored = self._slots, self._raw
        mask = len(slots) - 1
        slot = int.from_bytes(raw[:8], "little") & mask
        while True:
            held = slots[slot]
            if held == _EMPTY:
                return slot
            start = (held - 1) * DIGEST_BYTES
            if stored[start : start + DIGEST_BYTES] == raw:
                return slot
            slot = (slot + 1) & mask

    def _grow(self) -> None:
        size = len(self._slots) * 2
        mask = size - 1
        slots = array("I", bytes(4 * size))
        stored = self._raw
        for index in range(len(self._sizes)):
            if index in self._odd_at:
                continue
            start = index * DIGEST_BYTES
            slot = int.from_bytes(stored[start : start + 8], "little") & mask
            while slots[slot] != _EMPTY:
                slot = (slot + 1) & mask
            slots[slot] = index + 1
        self._slots = slots

    def _index(self, digest: str) -> int:
        """``digest``'s index, or -1."""
        raw = _raw(digest)
        if raw is None:
            return self._odd.get(digest, -1)
        return self._slots[self._slot(raw)] - 1

    def _key(self, index: int) -> str:
        odd = self._odd_at.get(index) if self._odd_at else None
        if odd is not None:
            return odd
        start = index * DIGEST_BYTES
        return self._raw[start : start + DIGEST_BYTES].hex()

    def __contains__(self, digest: object) -> bool:
        return isinstance(digest, str) and self._index(digest) >= 0

    def __getitem__(self, digest: str) -> int:
        index = self._index(digest) if isinstance(digest, str) else -1
        if index < 0:
            raise KeyError(digest)
        return self._sizes[index]

    def __iter__(self) -> Iterator[str]:
        return (self._key(i) for i in range(len(self._sizes)))

    def __len__(self) -> int:
        return len(self._sizes)

    def items(self) -> Iterator[tuple[str, int]]:  # type: ignore[override]
        """``(digest, size)`` in the order added."""
        sizes = self._sizes
        return ((self._key(i), sizes[i]) for i in range(len(sizes)))

    def values(self) -> Iterator[int]:  # type: ignore[override]
        """Sizes in the order added."""
        return iter(self._sizes)

    def total(self) -> int:
        """Sum of the sizes, bytes."""
        return sum(self._sizes)


def _raw(digest: str) -> bytes | None:
    """The 16 bytes of a digest of 32 lowercase hex characters, else None."""
    if len(digest) != 2 * DIGEST_BYTES:
        return None
    try:
        raw = bytes.fromhex(digest)
    except ValueError:
        return None
    return raw if raw.hex() == digest else None
