"""hub.serve.wire.manifest_messages charges each GetManifest page whole as soon as it is
built, read-ahead included, and gives every charge back once the page has left or the
stream ends (issue 39's seventh probe: a client that never took the small first message
kept 1.1 MB entries and the read-ahead page behind it uncounted)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from hub.catalog import Catalog
from hub.errors import QuotaExceeded
from hub.limits.replies import ReplyBytes
from hub.publish.tree import publish
from hub.serve.wire import MANIFEST_MESSAGE_BYTES, manifest_messages

BLOCK = 64


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A small file first (its entry a small first message), then four files of 4,000
    64-byte blocks (entries of about 150 KB: one a page, each past the page cut)."""
    base = tmp_path_factory.mktemp("charges")
    src = base / "src"
    src.mkdir()
    (src / "a-small").write_bytes(b"x")
    for i in range(4):
        # distinct blocks: each entry lists 4,000 digests
        (src / f"b{i}").write_bytes(bytes(range(256)) * 1000 + i.to_bytes(4, "big") * 16)
    publish(base / "data", "big", src, block_size=BLOCK)
    with Catalog(base / "data" / "catalog") as catalog:
        return base / "data" / "catalog", catalog.resolve("big", "latest").snapshot_id


def test_a_stream_that_takes_only_its_first_message_holds_its_pages_charged(
    snapshot: tuple[Path, str],
) -> None:
    path, snapshot_id = snapshot
    replies = ReplyBytes(per_token=1 << 30, total=1 << 30)
    charges: list[int] = []

    def charge(size: int) -> int:
        charges.append(size)
        return replies.take("t", size)

    async def main() -> tuple[int, int, int, int]:
        with Catalog(path) as catalog:
            messages = manifest_messages(
                catalog, snapshot_id, charge=charge,
                release=lambda c: replies.release("t", c),
            )  # fmt: skip
            async with contextlib.aclosing(messages):
                first = await anext(messages)  # a-small's entry: small
                for _ in range(3000):  # let the read-ahead page arrive (a loaded worker is slow)
                    await asyncio.sleep(0.01)
                    if len(charges) >= 2:
                        break
                held, total = replies.held_by("t"), replies.held
            return len(first), held, total, replies.held_by("t")

    first, held, total, after = asyncio.run(main())
    assert first < MANIFEST_MESSAGE_BYTES
    # the first page (the small entries and the first large one) and the read-ahead
    # page (the next large entry), each charged whole while the first message waits
    assert len(charges) == 2 and all(size > 100_000 for size in charges), charges
    assert held == total == 3 * sum(charges)
    assert after == 0 and replies.held == 0  # the stream ended: every charge given back


def test_a_whole_manifest_read_gives_every_charge_back_and_a_refused_page_ends_it(
    snapshot: tuple[Path, str],
) -> None:
    path, snapshot_id = snapshot

    async def read(replies: ReplyBytes, read_ahead: bool = False) -> int:
        asked: list[int] = []  # every charge asked for, refused ones included

        def charge(size: int) -> int:
            asked.append(size)
            return replies.take("t", size)

        with Catalog(path) as catalog:
            messages = manifest_messages(
                catalog, snapshot_id, charge=charge,
                release=lambda c: replies.release("t", c),
            )  # fmt: skip
            async with contextlib.aclosing(messages):
                got = [await anext(messages)]
                # the read-ahead page is built and charged while the first page waits;
                # wait for its charge rather than a fixed time (a loaded worker may take
                # longer than any pause to build it)
                for _ in range(3000 if read_ahead else 0):
                    if len(asked) >= 2:
                        break
                    await asyncio.sleep(0.01)
                assert not read_ahead or len(asked) >= 2, "the read-ahead page was never built"
                return len(got + [m async for m in messages])

    replies = ReplyBytes(per_token=1 << 30, total=1 << 30)
    assert asyncio.run(read(replies)) == 5  # a-small, b0..b3
    assert replies.held == 0
    # a share that holds one large page, not two: the read-ahead page, built while the
    # first waits, is refused, and the stream ends with the refusal
    tight = ReplyBytes(per_token=3 * 200_000, total=1 << 30)
    with pytest.raises(QuotaExceeded):
        asyncio.run(read(tight, read_ahead=True))
    assert tight.held == 0
