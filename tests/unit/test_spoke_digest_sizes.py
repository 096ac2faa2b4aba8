"""The daemon's digest → size table (spoke.catalog.digests) against a dict: membership,
sizes, order and counts exact, through its growth."""

from __future__ import annotations

import random

from protocol.hub.v1 import hub_pb2
from spoke.catalog.digests import DigestSizes
from spoke.catalog.snapshots import SnapshotIndex


def test_it_answers_as_a_dict_would() -> None:
    rng = random.Random(7)
    table, model = DigestSizes(), {}
    digests = [rng.randbytes(16).hex() for _ in range(5000)]
    digests += ["AB" * 16, "ab" * 20, "not hex at all", "00" * 16]  # odd ones kept as given
    for digest in digests + digests[:100]:  # the repeats keep their first size
        size = rng.randint(0, (1 << 32) - 1)
        assert table.add(digest, size) == (digest not in model)
        model.setdefault(digest, size)
    assert len(table) == len(model)
    assert list(table.items()) == list(model.items())
    assert list(table) == list(model) and list(table.values()) == list(model.values())
    assert table.total() == sum(model.values())
    for digest in digests:
        assert digest in table and table[digest] == model[digest]
    for _ in range(2000):
        absent = rng.randbytes(16).hex()
        assert absent not in table and table.get(absent) is None
    assert "ab" * 16 not in table and 5 not in table


def test_the_index_keeps_file_blocks_in_manifest_order() -> None:
    def blocks(*refs: tuple[str, int]) -> list[hub_pb2.BlockRef]:
        return [hub_pb2.BlockRef(digest=d * 16, size=s) for d, s in refs]

    entries = [
        hub_pb2.ManifestEntry(
            path="a", type=hub_pb2.ENTRY_TYPE_FILE, blocks=blocks(("01", 4), ("02", 2))
        ),
        hub_pb2.ManifestEntry(path="b", type=hub_pb2.ENTRY_TYPE_DIRECTORY),
        hub_pb2.ManifestEntry(
            path="c", type=hub_pb2.ENTRY_TYPE_FILE, blocks=blocks(("02", 2), ("03", 1))
        ),
    ]
    index = SnapshotIndex()
    snap = index.learn("d@v1", entries)
    assert list(snap.sizes.items()) == [("01" * 16, 4), ("02" * 16, 2), ("03" * 16, 1)]
    assert snap.total_bytes == 7
    assert index.lookup("02" * 16) == [snap] and index.lookup("04" * 16) == []
