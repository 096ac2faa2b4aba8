"""Reply bytes waiting for their clients (hub/limits/replies.py): a token's share, the
hub's total, and one reply of any size passing alone."""

from __future__ import annotations

import pytest

from hub.errors import QuotaExceeded
from hub.limits.replies import COPIES, ReplyBytes


def test_a_token_holds_its_share_and_one_large_reply_passes_alone() -> None:
    replies = ReplyBytes(per_token=30, total=100)
    big = replies.take("a", 40)  # 120 charged: alone, it passes
    assert big == COPIES * 40 and replies.held_by("a") == 120
    with pytest.raises(QuotaExceeded, match="beyond 30 a token"):
        replies.take("a", 1)  # a's share is spent
    with pytest.raises(QuotaExceeded, match="at most 30 a token"):
        replies.check("a")  # refused before its next reply is built
    with pytest.raises(QuotaExceeded, match="in all"):
        replies.check("b")  # the hub's total is spent by a's large reply
    with pytest.raises(QuotaExceeded):
        replies.take("b", 1)  # the hub's total too, while a's large reply waits
    replies.release("a", big)
    assert replies.held == 0 and replies.held_by("a") == 0
    replies.check("a")
    small = [replies.take(name, 5) for name in "abcdef"]  # 15 each: 90 of 100
    with pytest.raises(QuotaExceeded, match="in all"):
        replies.take("g", 5)
    replies.take("a", 3)  # 24 of a's 30, 99 of 100
    for name, charge in zip("abcdef", small, strict=True):
        replies.release(name, charge)
    assert replies.held == 9
