"""The wrappers every handler of :class:`hub.serve.service.HubService` goes through: the gate's
principal (fail closed without one), oversize requests refused, the call's slot or its
active-stream gauge, its status mapped (:meth:`HubService._abort`) and counted — for a
unary handler (:func:`_unary`), a response-streaming one (:func:`_streaming`) and one that
writes its own timed messages (:func:`_writing`, ``ReadBlocks``); and a request stream
whose first message is read ahead (:func:`_first_taken`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, Protocol, TypeVar

import grpc

from hub.auth.tokens import Principal
from hub.errors import Unauthenticated
from hub.limits.replies import ReplyBytes
from hub.limits.streams import ReplyHold, StreamSlots
from hub.serve.metrics import HubMetrics
from hub.serve.wire import Oversize

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


class _Service(Protocol):
    """What the wrappers use of the servicer."""

    _metrics: HubMetrics

    _reply_bytes: ReplyBytes

    def _unary_slots(self, method: str) -> StreamSlots: ...

    def count(self, method: str, code: grpc.StatusCode) -> None: ...

    async def _abort(self, method: str, context: Any, error: Exception) -> NoReturn: ...


_S = TypeVar("_S", bound=_Service)


_UNGATED = Unauthenticated("this hub serves without its authentication interceptor (HubGate)")
"""Raised when a call reaches a handler without a principal: fail closed."""


def _unary(
    method: Callable[[_S, _Request, Principal], Awaitable[_Response]],
) -> Callable[..., Awaitable[_Response]]:
    """Wraps a unary handler: the gate's principal, limits, status mapping, counting."""
    name = method.__name__

    @functools.wraps(method)
    async def handler(
        self: _S, request: _Request, context: Any, principal: Principal | None = None
    ) -> _Response:
        try:
            if principal is None:
                raise _UNGATED
            if isinstance(request, Oversize):
                raise request.error()
            # the slot is held until the reply has left (a reply the client does not read
            # stays at the hub after the handler returned), released when the call is done
            slots = self._unary_slots(name)
            await slots.acquire(principal.name)
            hold = ReplyHold(slots, principal.name)
            context.add_done_callback(hold.done)
            response = await method(self, request, principal)
            # its bytes are charged until the call is done (limits.replies)
            replies, who = self._reply_bytes, principal.name
            charge = replies.take(who, response.ByteSize())  # type: ignore[attr-defined]
            context.add_done_callback(lambda _: replies.release(who, charge))
            hold.arm()  # the reply is the client's to take now
        except asyncio.CancelledError:
            self.count(name, grpc.StatusCode.CANCELLED)
            raise
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await self._abort(name, context, exc)
        self.count(name, grpc.StatusCode.OK)
        return response

    return handler


def _streaming(
    method: Callable[[_S, _Request, Principal], AsyncIterator[_Response]],
) -> Callable[..., AsyncIterator[_Response]]:
    """Wraps a response-streaming handler: the gate's principal, limits, status, counting."""
    name = method.__name__

    @functools.wraps(method)
    async def handler(
        self: _S, request: _Request, context: Any, principal: Principal | None = None
    ) -> AsyncIterator[_Response]:
        active = self._metrics.active_streams.labels(method=name)
        active.inc()
        try:
            if principal is None:
                raise _UNGATED
            if isinstance(request, Oversize):
                raise request.error()
            async for response in method(self, request, principal):
                yield response
        except asyncio.CancelledError:
            self.count(name, grpc.StatusCode.CANCELLED)
            raise
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await self._abort(name, context, exc)
        finally:
            active.dec()
        self.count(name, grpc.StatusCode.OK)

    return handler


def _writing(
    method: Callable[[_S, _Request, Any, Principal], Awaitable[None]],
) -> Callable[..., Awaitable[None]]:
    """Wraps a response-streaming handler that writes its own messages (each send timed,
    :func:`hub.serve.sending.send_blocks`): the gate's principal, limits, status,
    counting. A
    call whose status was sent already (a stalled stream, counted when it was ended) is
    not counted again."""
    name = method.__name__

    @functools.wraps(method)
    async def handler(
        self: _S, request: _Request, context: Any, principal: Principal | None = None
    ) -> None:
        active = self._metrics.active_streams.labels(method=name)
        active.inc()
        try:
            if principal is None:
                raise _UNGATED
            if isinstance(request, Oversize):
                raise request.error()
            await method(self, request, context, principal)
        except asyncio.CancelledError:
            if not context.done():
                self.count(name, grpc.StatusCode.CANCELLED)
            raise
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await self._abort(name, context, exc)
        finally:
            active.dec()
        if not context.done():
            self.count(name, grpc.StatusCode.OK)

    return handler


REFUSE_READ_S = 1.0
"""Longest a stream about to be refused waits for its request first, seconds."""


async def _first_taken(requests: AsyncIterator[_Request]) -> AsyncIterator[_Request]:
    """``requests`` with its first message already read (within :data:`REFUSE_READ_S`;
    none if it did not come), as an iterator that yields it again first."""
    first: list[_Request] = []
    with contextlib.suppress(TimeoutError, StopAsyncIteration):
        first.append(await asyncio.wait_for(anext(requests), REFUSE_READ_S))

    async def chained() -> AsyncIterator[_Request]:
        for request in first:
            yield request
        async for request in requests:
            yield request

    return chained()
