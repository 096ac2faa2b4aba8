"""Where blocks come from: the :class:`BlockSource` interface.

A source streams whole blocks for a list of ``(digest, size)``, asked for in one class
(:class:`~spoke.fetch.priority.Priority`): everything a source needs to know about a
request comes in the call, so a source never asks the scheduler. It says nothing about caching or
retries (the fetcher does those); it delivers bytes or raises a
:class:`spoke.errors.SpokeError`. A source whose ``verifies`` is true hashes what it yields
itself and may yield a block already written to its temporary file
(:class:`spoke.cache.staging.Staged`, the bulk channel's receive threads); the fetcher
verifies every other source's blocks. The hub is one (:class:`spoke.hublink.source.HubSource`);
the regional mesh (another spoke that has the block, :mod:`spoke.mesh.source`) is tried
before the hub behind the same interface.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from spoke.cache.store import Received
from spoke.fetch.priority import Priority


class BlockSource(Protocol):
    """Something that can deliver blocks by digest."""

    @property
    def name(self) -> str:
        """Where the blocks come from, for logs and status (``HOST:PORT`` for the hub)."""
        ...

    def read_blocks(
        self, blocks: Sequence[tuple[str, int]], timeout: float, priority: Priority
    ) -> AsyncIterator[tuple[str, Received]]:
        """Yield ``(digest, bytes)`` for every block, each once, unverified (the hub: in
        request order; the regional mesh, :mod:`spoke.mesh.source`: as they arrive).

        Args:
            blocks: the blocks wanted, ``(digest, size)`` (the size from this spoke's
                manifests: the most a source may send).
            timeout: deadline of the whole stream, seconds.
            priority: the class they were asked for in.

        Raises:
            NotFound: the source does not have a block (no point retrying).
            InvalidRequest: the source refused the request.
            HubUnavailable: the source could not be reached, or the stream broke or came
                out of order; another attempt may succeed.
        """
        ...
