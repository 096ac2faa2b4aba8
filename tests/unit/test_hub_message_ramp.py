"""The sizes of a ReadBlocks stream's messages (hub.serve.blockstream.MessageRamp): 64 KiB
first, each next twice the one before, up to the chunk size, so that a client that never
reads stalls on a small message; and the stall deadline that goes with a message's size
(hub.limits.budget.ReadBudget.send_deadline)."""

from __future__ import annotations

import pytest

from hub.limits.budget import STALL_FLOOR_S, ReadBudget
from hub.serve.blockstream import FIRST_MESSAGE_BYTES, MessageRamp

KiB, MiB = 1 << 10, 1 << 20


def test_messages_start_at_64_kib_and_double_up_to_the_chunk() -> None:
    ramp = MessageRamp(MiB)
    assert ramp.peek() == FIRST_MESSAGE_BYTES == 64 * KiB
    assert ramp.peek(after=2) == 256 * KiB
    assert [ramp.take() for _ in range(7)] == [
        64 * KiB,
        128 * KiB,
        256 * KiB,
        512 * KiB,
        MiB,
        MiB,
        MiB,
    ]
    assert ramp.peek(after=10) == MiB


def test_a_chunk_smaller_than_the_first_message_is_every_message() -> None:
    ramp = MessageRamp(16 * KiB)
    assert [ramp.take() for _ in range(3)] == [16 * KiB] * 3


@pytest.mark.parametrize(
    ("stall_s", "message", "deadline"),
    [
        (30.0, MiB, 30.0),  # a chunk: the whole stall timeout
        (30.0, 4 * MiB, 120.0),  # a larger chunk setting: per MiB
        (30.0, 128 * KiB, 3.75),
        (30.0, 64 * KiB, STALL_FLOOR_S),  # never under the floor
        (1.0, 64 * KiB, 1.0),  # unless the stall timeout itself is shorter
    ],
)
def test_a_messages_stall_deadline_follows_its_size(
    stall_s: float, message: int, deadline: float
) -> None:
    assert ReadBudget(stall_s=stall_s).send_deadline(message) == pytest.approx(deadline)
