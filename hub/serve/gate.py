"""The hub's door: every Hub call is authenticated from its metadata before any request
byte is read.

gRPC reads and deserializes a unary request (up to the core receive limit, 64 MiB) before
it calls the handler, so a token checked in the handler lets anyone make the hub hold
large messages. :class:`HubGate` is a server interceptor (gRFC L47, ``grpc.aio``'s
``ServerInterceptor``): ``intercept_service`` runs when the call's headers have arrived
and before its message is received. It authenticates the call's ``authorization``
metadata (:meth:`hub.auth.tokens.TokenTable.authenticate`, the only place a token is checked)
and then either

- passes the call on with the caller's :class:`~hub.auth.tokens.Principal` bound to the
  handler's ``principal`` argument (:func:`hub.serve.calls._unary` / ``_streaming`` take it
  from there), a call with a unary request first taking one of its token's call slots
  (:data:`CALLS`) and receiving its request through :func:`hub.serve.inbound.receive` (within
  :data:`~hub.serve.inbound.REQUEST_WAIT_S`, its bytes charged to the token's read budget
  meanwhile), or
- answers ``UNAUTHENTICATED`` through a handler that takes a request *stream* and never
  iterates it, so gRPC never receives the message: it is counted and audited
  (rate-limited) like any refused call, by :meth:`hub.serve.service.HubService.refuse`.

Health checking and reflection are not Hub calls and stay open (see :mod:`hub.serve.server`).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

from hub.auth.tokens import ANONYMOUS, Principal, TokenFile, TokenTable
from hub.errors import HubError, InvalidArgument, QuotaExceeded, Unauthenticated
from hub.limits.budget import ReadBudget
from hub.limits.streams import StreamSlots
from hub.serve.inbound import receive
from hub.serve.wire import SERVICE_NAME

Refuse = Callable[[str, Any, HubError], Awaitable[NoReturn]]
"""Ends a call with an error: ``(method name, context, error)``."""

CALLS = 4096
"""Most calls with a unary request open at once, a token at most an eighth (512): from
their headers until done, their request received or not (``ReadBlocks`` streams have
their own slots, :mod:`hub.limits.budget`). 4,096 calls whose request never completes hold about
230 MiB."""


class _Admission:
    """A call's slot among the calls open for its token (:data:`CALLS`), taken when its
    headers pass the gate and given back when gRPC reports it done, and its one request,
    received by :func:`hub.serve.inbound.receive`. A token whose clients start calls and never
    finish sending them (gRPC holds what arrived, at most one 64 KiB window, and its call
    state) holds at most its share of the slots, and of the read budget while it sends."""

    def __init__(
        self,
        slots: StreamSlots,
        budget: ReadBudget,
        refuse: Refuse,
        method: str,
        prove: Callable[[str, str], None],
    ) -> None:
        self.slots, self.budget, self.refuse, self.method = slots, budget, refuse, method
        self.prove = prove

    async def request(self, requests: AsyncIterator[Any], context: Any, name: str) -> Any:
        """The call's request once its slot is held; refuses the call otherwise. Its
        token passed the gate: the port's door keeps its connection from now on."""
        self.prove(str(context.peer()), name)
        try:
            await self.slots.acquire(name)
        except QuotaExceeded as error:  # at once: waiting for its request would hold it
            await self.refuse(self.method, context, error)
        context.add_done_callback(lambda _: self.slots.release(name))
        try:
            request = await receive(requests, self.budget, name)
        except HubError as error:  # no room, or no request in time
            await self.refuse(self.method, context, error)
        if request is None:
            await self.refuse(self.method, context, InvalidArgument("no request message"))
        return request


def _bind(
    handler: grpc.RpcMethodHandler, principal: Principal, admission: _Admission
) -> grpc.RpcMethodHandler:
    """``handler`` with its behaviour called as ``behaviour(request, context,
    principal=principal)``; a unary request is taken as a request stream, so the call is
    admitted (:class:`_Admission`) before its message is received (the wire is the same)."""
    name = principal.name
    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        unary = handler.unary_unary

        async def answer(requests: AsyncIterator[Any], context: Any) -> Any:
            request = await admission.request(requests, context, name)
            return await unary(request, context, principal=principal)

        return grpc.stream_unary_rpc_method_handler(answer, **serializers)
    if handler.unary_stream is not None:
        streaming = handler.unary_stream

        async def stream(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            request = await admission.request(requests, context, name)
            async for response in streaming(request, context, principal=principal):
                yield response

        return grpc.stream_stream_rpc_method_handler(stream, **serializers)
    for field in ("stream_unary", "stream_stream"):
        behaviour = getattr(handler, field)
        if behaviour is not None:
            # functools.partial keeps inspect.iscoroutinefunction / isasyncgenfunction
            # true, which is how grpc.aio picks the way it calls a behaviour
            return handler._replace(**{field: functools.partial(behaviour, principal=principal)})
    return handler


def _refusal(
    handler: grpc.RpcMethodHandler,
    method: str,
    error: HubError,
    refuse: Refuse,
    unprove: Callable[[str], None] = lambda peer: None,
) -> grpc.RpcMethodHandler:
    """A handler for the same method that ends the call with ``error`` without reading
    its request: a request-streaming handler whose iterator is never touched. Its
    connection's proof is taken back (``unprove(context.peer())``): its token was one
    once, perhaps, and is not now."""

    async def behaviour(requests: AsyncIterator[Any], context: Any) -> None:
        unprove(str(context.peer()))
        await refuse(method, context, error)

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(behaviour)
    return grpc.stream_unary_rpc_method_handler(behaviour)


class HubGate(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Authenticates every ``protocol.hub.v1.Hub`` call before its request is received.

    Args:
        tokens: Accepted bearer tokens; None lets every caller in as
            :data:`hub.auth.tokens.ANONYMOUS` (a hub without tokens).
        refuse: Ends a refused call (counts, audits and aborts; it always raises).
        budget: The read budget requests are charged to while they arrive (the one the
            service charges blocks to).
        calls: Most calls with a unary request open at once (:data:`CALLS`).
        prove: Tells the port's door (:class:`strata_local.door.Door`) that a call on the
            connection of this ``context.peer()`` carried an accepted token: ``(peer,
            the token's subject)``.
        unprove: Tells the door that a call on the connection of this ``context.peer()``
            carried no accepted token (a connection that proved a token since revoked
            may be displaced again).
    """

    def __init__(
        self,
        tokens: TokenTable | TokenFile | None,
        refuse: Refuse,
        budget: ReadBudget,
        calls: int = CALLS,
        prove: Callable[[str, str], None] = lambda peer, holder: None,
        unprove: Callable[[str], None] = lambda peer: None,
    ) -> None:
        self._tokens = tokens
        self._prove, self._unprove = prove, unprove
        self._refuse = refuse
        self._budget = budget
        self._calls = StreamSlots("call", "hub.serve.gate.CALLS", calls)

    def authenticate(self, metadata: Any) -> Principal:
        """The caller of a call with this invocation metadata.

        Raises:
            Unauthenticated: No valid bearer token (only when the hub has tokens).
        """
        if self._tokens is None:
            return ANONYMOUS
        return self._tokens.authenticate(metadata or ())

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or not method.startswith(f"/{SERVICE_NAME}/"):
            return handler
        try:
            principal = self.authenticate(handler_call_details.invocation_metadata)
        except Unauthenticated as error:
            return _refusal(handler, method.rpartition("/")[2], error, self._refuse, self._unprove)
        admission = _Admission(
            self._calls, self._budget, self._refuse, method.rpartition("/")[2], self._prove
        )
        return _bind(handler, principal, admission)
