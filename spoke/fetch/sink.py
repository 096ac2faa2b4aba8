"""Where the fetcher's verified blocks go: :class:`CacheSink` writes each through into the
cache and moves its life (:mod:`spoke.fetch.life`) — verified, then resident, streamed
through or failed — so nobody is called back from inside the fetch: whoever cares about a
block subscribes to its life.

A block the cache cannot take (disk full with nothing evictable, every byte pinned, a
failed write, or a prefetch with no room) is handed to its readers in memory instead
(stream-through; a staged block's bytes are read back from its temporary file, which is
then deleted).

Everything runs on the daemon's event loop (no locks).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable

from spoke import metrics
from spoke.cache.admission import CacheFull, PrefetchRefused
from spoke.cache.blockcache import BlockCache
from spoke.cache.staging import Staged
from spoke.cache.store import Received
from spoke.errors import HubUnavailable
from spoke.fetch.life import BlockLives
from spoke.fetch.lifestate import Life
from spoke.fetch.priority import Priority

log = logging.getLogger(__name__)


class CacheSink:
    """The fetcher's sink into ``cache`` for the blocks whose lives ``lives`` holds.

    Args:
        lives: every block's life (the sink moves them).
        cache: where verified blocks go.
        on_first_bytes: told ``(seconds, nbytes)`` when a stream's first block arrives
            (a round-trip sample: the pacer's).
    """

    def __init__(
        self,
        lives: BlockLives,
        cache: BlockCache,
        on_first_bytes: Callable[[float, int], None] | None = None,
    ) -> None:
        self.lives = lives
        self.cache = cache
        self._on_first_bytes = on_first_bytes

    def first_bytes(self, seconds: float, nbytes: int) -> None:
        """A stream's first block (``nbytes``) arrived ``seconds`` after it was opened."""
        if self._on_first_bytes is not None:
            self._on_first_bytes(seconds, nbytes)

    def put(self, digest: str, data: Received) -> Coroutine[None, None, None]:
        """The verified block ``digest`` arrived: its life moves to verified now, and the
        returned coroutine admits it and settles the life (it never raises). A block that
        is not on the wire any more (nobody waits for it here) is dropped."""
        return self._admit(self.lives.arrived(digest), data)

    async def _admit(self, life: Life | None, data: Received) -> None:
        if life is None:
            if isinstance(data, Staged):
                data.discard()
            return
        digest = life.digest
        try:
            urgent = life.priority is Priority.DEMAND  # a reader waits
            await self.cache.admit(digest, data, life.placement(), urgent)
        except PrefetchRefused as err:  # nobody waits for it: the cache is under pressure
            log.debug("%s", err)
        except CacheFull as err:
            log.warning("%s; streaming the block through uncached", err)
            metrics.STREAMED_THROUGH.inc()
        except Exception:
            log.exception("could not cache block %s; streaming it through uncached", digest)
            metrics.STREAMED_THROUGH.inc()
        else:
            self.lives.admitted(life)
            return
        await self._through(life, data)

    def fail(self, digests: Iterable[str], error: BaseException) -> None:
        """The fetch of ``digests`` gave up with ``error``."""
        for digest in list(digests):
            self.lives.fail(digest, error)

    async def _through(self, life: Life, data: Received) -> None:
        """Hands a block the cache did not take to its readers as ``bytes`` (a source may
        hand over a ``bytearray`` it received in place, or a staged file)."""
        if isinstance(data, Staged):
            staged = data
            try:
                data = await asyncio.to_thread(self.cache.store.read_staged, staged)
            except Exception as err:  # its file is gone or unreadable: the readers retry
                self.lives.fail(life.digest, HubUnavailable(f"block {life.digest} lost: {err}"))
                return
            finally:
                staged.discard()
        self.lives.streamed(life, data if type(data) is bytes else bytes(data))
