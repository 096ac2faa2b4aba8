"""Writing a ``ReadBlocks`` stream's messages, each within its deadline.

gRPC's flow control decides when a message leaves: a client that does not read keeps the
hub's write waiting, and the message (with everything queued behind it) in gRPC core.
:func:`write_timed` gives each message its deadline from the read budget (the stall
timeout per MiB, at least 2 s; 2 s while the writer's token holds more than its fair share
and a lighter token waits), and :func:`send_blocks` ends a stream whose message missed it,
with what the stalled message still holds charged to its token.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

from hub.limits.budget import STALL_FLOOR_S, ReadBudget, stall_error, stalled_charge


async def send_blocks(
    context: Any,
    messages: AsyncGenerator[bytes, None],
    budget: ReadBudget,
    who: str,
    abort: Callable[[str, Any, Exception], Awaitable[NoReturn]],
) -> bool:
    """Writes ``messages``, each within its stall deadline; False when one was not,
    and the call has been ended.

    A message the client's flow-control window has not taken within its deadline
    (:func:`write_timed`: the stall timeout per MiB, at least 2 s, a stream's first
    messages small; 2 s while ``who`` holds more than its fair share and a token
    holding less waits) ends the stream: ``messages`` is closed, which gives
    back its charges, and the call is ended RESOURCE_EXHAUSTED (counted
    ``limit="stall"`` and audited). The message stays in gRPC core until the client
    reads it, cancels or goes away (``grpc.aio`` cannot reset one stream), and so does
    its status, queued behind it: until then it stays charged to ``who`` (in the
    budget's stalled pool, :meth:`ReadBudget.take_stalled`) and the stream keeps its
    slot, so what stalled streams leave in core stays bounded.

    Raises:
        asyncio.CancelledError: the call ended under a write (the client went away).
    """
    stalled, deadline_s = 0, 0.0
    async with contextlib.aclosing(messages):
        async for message in messages:
            try:
                left = await write_timed(context, message, budget, who)
            except Exception:
                # the call ended under the write (the client went away, the server
                # stops): what grpc.aio does with a cancelled call, quietly
                raise asyncio.CancelledError from None
            if left is not None:
                stalled, deadline_s = stalled_charge(len(message)), left
                break
    if not stalled:
        return True
    pooled = budget.take_stalled(who, stalled)
    try:
        error = stall_error(f"a block's message of {stalled} bytes", deadline_s)
        await abort("ReadBlocks", context, error)
    except grpc.aio.AbortError:
        raise
    except Exception:  # the call ended (the client went away) before its status left
        pass
    finally:
        budget.release_stalled(who, stalled, pooled)
    return False


async def write_timed(context: Any, message: bytes, budget: ReadBudget, who: str) -> float | None:
    """Writes one message within its deadline (:meth:`ReadBudget.send_deadline`), or
    within :data:`~hub.limits.budget.STALL_FLOOR_S` while ``who`` holds more than its fair
    share and a token holding less waits (:meth:`ReadBudget.outweighed`).

    Returns:
        None once it has left; the seconds it was given when it had not (the write is
        cancelled).
    """
    deadline = budget.send_deadline(len(message))
    write = asyncio.ensure_future(context.write(message))
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        while True:
            done, _ = await asyncio.wait((write,), timeout=min(deadline, STALL_FLOOR_S) / 4)
            if done:
                write.result()
                return None
            waited = loop.time() - started
            if waited >= deadline or (waited >= STALL_FLOOR_S and budget.outweighed(who)):
                return round(waited, 1)
    finally:
        if not write.done():
            write.cancel()
            with contextlib.suppress(BaseException):
                await write
        elif not write.cancelled():
            write.exception()  # retrieved: a write the call's end failed is not news
