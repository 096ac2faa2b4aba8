"""Receiving a call's request messages: each within a deadline, its bytes charged to the
caller's read budget while they arrive.

gRPC core reads a request message into memory only once the server asks for it (an
iterator's ``anext``), and then opens the stream's HTTP/2 window to the length the
message declares, within :data:`hub.serve.wire.CORE_REQUEST_BYTES`. A caller that declares a
message and never finishes it holds what it sent for as long as the hub waits. So every
request message, of a unary call (:mod:`hub.serve.gate`) or of a ``ReadBlocks`` stream
(:mod:`hub.serve.service`), is received through :func:`receive`:

- before it is asked for, :data:`~hub.serve.wire.CORE_REQUEST_BYTES` are charged to the
  caller's share of the read budget and the hub's (:class:`hub.limits.budget.ReadBudget`,
  waiting ahead of block charges; a stream's later messages only when there is room at
  once), and released when the message has arrived or the call has ended; so what
  unfinished requests hold counts against the same bytes blocks do;
- it must arrive within :data:`REQUEST_WAIT_S` of being asked for, budget wait included;
  a caller that stalls is refused ``RESOURCE_EXHAUSTED`` (:class:`~hub.errors.QuotaExceeded`,
  ``limit="request"``: counted and audited) and the call ends, freeing what gRPC held.

An honest client sends its request as it opens the call (a spoke's is a few hundred
bytes), so the charge lasts one round trip and the deadline is never near.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

from hub.errors import QuotaExceeded
from hub.limits.budget import ReadBudget
from hub.serve.wire import CORE_REQUEST_BYTES

REQUEST_WAIT_S = 10.0
"""Longest a request message may take to arrive once the hub asks for it, seconds."""

_Message = TypeVar("_Message")


async def receive(
    requests: AsyncIterator[_Message],
    budget: ReadBudget,
    name: str,
    wait_s: float | None = None,
    first: bool = True,
) -> _Message | None:
    """The next request message of a call, or None at the end of its request stream.

    Args:
        requests: The call's request iterator (gRPC's).
        budget: Where the message's bytes are charged while it arrives.
        name: The caller (its principal's name).
        wait_s: Longest wait, seconds, for room in the budget and the message together;
            :data:`REQUEST_WAIT_S` when None.
        first: Whether this is the call's first message. A later one (or the end of the
            stream, which a spoke sends with its one request) is charged only if the
            budget has room at once, else received uncharged: a stream that has sent its
            blocks must not fail for want of room to learn that it is over, and what it
            can hold meanwhile is still one window.

    Raises:
        QuotaExceeded: No room in the caller's share or the hub's within the wait.
        QuotaExceeded: ``limit="request"``: the message did not arrive within the wait.
    """
    wait_s = REQUEST_WAIT_S if wait_s is None else wait_s
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    charged = CORE_REQUEST_BYTES
    if first:
        await budget.take(name, charged, timeout_s=wait_s, ahead=True)
    elif not budget.try_take(name, charged):
        charged = 0
    try:
        return await asyncio.wait_for(anext(requests), max(0.0, deadline - loop.time()))
    except TimeoutError:
        raise QuotaExceeded(
            "request", f"no request message within {wait_s:g} s of asking for it"
        ) from None
    except StopAsyncIteration:
        return None
    finally:
        if charged:
            budget.release(name, charged)
