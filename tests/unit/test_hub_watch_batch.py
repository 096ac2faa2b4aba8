"""A ``Watch`` stream whose client takes no message holds at most one small batch of
decoded catalog events (hub.serve.watch.WATCH_BATCH), however long the history: issue
39's seventh probe held 1,000 a stream, 512 streams of eight tokens past 1 GiB."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hub.auth.tokens import Principal
from hub.catalog import Catalog
from hub.catalog.events import Event
from hub.publish.tree import publish
from hub.serve.watch import WATCH_BATCH, catalog_events
from protocol.hub.v1 import hub_pb2


class CountingCatalog:
    """The catalog, counting the events each ``events_after`` call decodes."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self.decoded: list[int] = []

    def events_after(self, sequence: int, limit: int = 1000) -> list[Event]:
        events = self._catalog.events_after(sequence, limit)
        self.decoded.append(len(events))
        return events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._catalog, name)


def test_a_stalled_watch_holds_one_small_batch_and_a_reader_gets_every_event(
    tmp_path: Path,
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"x")
    publish(tmp_path / "data", "hidden", src)  # a dataset the watcher may not read
    publish(tmp_path / "data", "hidden", src)
    with Catalog(tmp_path / "data" / "catalog") as catalog:
        for i in range(300):  # 300 tag moves it cannot see
            catalog.set_tag("hidden", "t", f"v{1 + i % 2}")
        publish(tmp_path / "data", "mine", src)
        last = catalog.last_sequence()
    assert WATCH_BATCH <= 64

    async def main() -> tuple[list[int], hub_pb2.CatalogEvent, list[hub_pb2.CatalogEvent]]:
        with Catalog(tmp_path / "data" / "catalog") as real:
            spy = CountingCatalog(real)
            principal = Principal("t", ("mine",))
            request = hub_pb2.WatchRequest(after_sequence=0)
            stalled = catalog_events(spy, None, request, principal)  # type: ignore[arg-type]
            first = await anext(stalled)  # the client takes one message, then nothing
            held = list(spy.decoded)
            await stalled.aclose()
            every = [e async for e in catalog_events(real, None, request, principal)]
            return held, first, every

    held, first, every = asyncio.run(main())
    # to find mine's first event behind 300 it may not see: small batches, one at a time
    assert max(held) <= WATCH_BATCH and len(held) >= 300 // WATCH_BATCH
    assert first.dataset == "mine" and first.sequence > 300
    assert every and every[0] == first and {e.dataset for e in every} == {"mine"}
    assert every[-1].sequence == last
