"""Rendezvous (highest-random-weight) hashing: which node of a set owns a block.

Every node scores every key with a hash of ``(node, key)``; the highest score owns it
(D. G. Thaler and C. V. Ravishankar, "Using name-based mappings to increase hit rates",
IEEE/ACM Transactions on Networking 6(1), 1998). Any two spokes that see the same live set
pick the same owner with no coordination, and a node joining or leaving moves only the keys
it wins or held: about ``1/n`` of them, each to the node that scored second.
"""

from __future__ import annotations

from collections.abc import Iterable

import xxhash


def weight(node: str, key: str) -> int:
    """The score of ``node`` for ``key``: 64 bits of xxh3 over both, separated by NUL.

    The same on every machine and Python (no per-process hash seed).
    """
    return xxhash.xxh3_64_intdigest(f"{node}\0{key}".encode())


def owner(key: str, nodes: Iterable[str]) -> str:
    """The node with the highest :func:`weight` for ``key`` (ties broken by name).

    Raises:
        ValueError: ``nodes`` is empty.
    """
    best: tuple[int, str] | None = None
    for node in nodes:
        score = (weight(node, key), node)
        if best is None or score > best:
            best = score
    if best is None:
        raise ValueError("no nodes to own the key")
    return best[1]


def ranked(key: str, nodes: Iterable[str]) -> list[str]:
    """Every node, the owner of ``key`` first, then who would own it if the owner left."""
    return sorted(nodes, key=lambda node: (weight(node, key), node), reverse=True)
