"""The peer port's door for its one unary call, ``Probe``: admitted from its headers
before gRPC receives its request.

gRPC reads a unary request whole before it calls the handler, so a token checked in the
handler let a caller with no token hold a 64 KiB request on every stream it opened and
never finished (issue 39's fifth probe: 256 connections x 128 streams took a spoke's
daemon from 68 to 2,816 MiB, kept after they closed). :class:`ProbeDoor` is a server
interceptor (gRFC L47, ``grpc.aio``'s ``ServerInterceptor``, as the hub's door,
``hub/serve/gate.py``): it serves the unary call as a request *stream* — the wire is the
same — whose one message is taken only once the call is admitted, and within
:data:`~spoke.mesh.peercall.REQUEST_WAIT_S`. ``ReadBlocks`` takes its request as a stream
already and admits itself first (:class:`~spoke.mesh.peerservice.PeerService`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from spoke.mesh.peercall import REQUEST_WAIT_S

Admit = Callable[[Any], Awaitable[None]]
"""Admits a call from its context, or ends it (``context.abort`` raises)."""


class ProbeDoor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Serves every unary-request method of the peer port as a request stream whose message
    is read only after ``admit(context)`` returned.

    Args:
        admit: admits the call (token, slot) or ends it; called before any request byte
            is read.
    """

    def __init__(self, admit: Admit) -> None:
        self._admit = admit

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        unary, admit = handler.unary_unary, self._admit

        async def answer(requests: AsyncIterator[Any], context: Any) -> Any:
            await admit(context)
            try:
                request = await asyncio.wait_for(anext(requests), REQUEST_WAIT_S)
            except TimeoutError:
                await context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"no request within {REQUEST_WAIT_S:g} s of the call",
                )
            except StopAsyncIteration:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no request")
            return await unary(request, context)

        return grpc.stream_unary_rpc_method_handler(
            answer,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
