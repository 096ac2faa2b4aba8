"""The region simulator's relay tree is the one built (spoke/mesh/relay.py): every other
node gets each first-batch block once, an owner sends at most 2 x 8 copies of a block, and
at 1,024 nodes the first batch keeps within one spoke alone + 1 s."""

from __future__ import annotations

import pytest

from bench.region_sim import MEASURED, RELAY_FANOUT, Job, relay_copies, simulate

JOB = Job(dataset_bytes=64 << 30)


@pytest.mark.parametrize("nodes", [1, 2, 9, 10, 64, 65, 1024])
def test_each_node_but_the_sender_gets_each_block_once(nodes: int) -> None:
    copies = relay_copies(nodes, 16, seed=7)
    assert sum(copies) == 16 * (nodes - 1)
    if nodes > 2 * RELAY_FANOUT:  # no node sends more than owner + relay roles allow
        assert max(copies) < 16 * (nodes - 1) / 4


def test_an_owner_sends_a_hot_block_at_most_sixteen_times() -> None:
    one = relay_copies(1024, 1, seed=3)
    assert max(one) == 2 * RELAY_FANOUT  # the owner: 8 first askers, ranks 1..8


def test_relays_keep_the_first_batch_within_the_target_at_1024_nodes() -> None:
    row = simulate(1024, 1, JOB, MEASURED)
    assert row.first_batch_s > row.alone_first_batch_s + 1  # the owners alone do not
    assert row.relay_first_batch_s <= row.alone_first_batch_s + 1
    assert row.checks["first batch through relays: senders out = readers in"]
