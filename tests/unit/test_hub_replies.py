"""Reply bytes waiting for their clients (hub/limits/replies.py): a token's share, the
hub's total, and one reply of any size passing alone."""

from __future__ import annotations

import pytest

from hub.errors import QuotaExceeded
from hub.limits.replies import COPIES, SMALL, ReplyBytes


def test_a_token_holds_its_share_and_one_large_reply_passes_alone() -> None:
    k = SMALL  # sizes in units of the smallest charged reply
    replies = ReplyBytes(per_token=30 * k, total=100 * k)
    big = replies.take("a", 40 * k)  # 120 charged: alone, it passes
    assert big == COPIES * 40 * k and replies.held_by("a") == 120 * k
    assert replies.take("b", k - 1) == 0  # a small reply is not charged, whatever is held
    with pytest.raises(QuotaExceeded, match=r"beyond \d+ a token"):
        replies.take("a", k)  # a's share is spent
    with pytest.raises(QuotaExceeded, match=r"at most \d+ a token"):
        replies.check("a")  # refused before its next reply is built
    replies.check("b")  # b's own share is not spent: only its large replies wait
    with pytest.raises(QuotaExceeded):
        replies.take("b", k)  # the hub's total too, while a's large reply waits
    replies.release("a", big)
    assert replies.held == 0 and replies.held_by("a") == 0
    replies.check("a")
    small = [replies.take(name, 5 * k) for name in "abcdef"]  # 15 each: 90 of 100
    with pytest.raises(QuotaExceeded, match="in all"):
        replies.take("g", 5 * k)
    replies.take("a", 3 * k)  # 24 of a's 30, 99 of 100
    for name, charge in zip("abcdef", small, strict=True):
        replies.release(name, charge)
    assert replies.held == 9 * k
