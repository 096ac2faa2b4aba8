"""The admin API's front door (pure ASGI, ahead of FastAPI): token, body cap, audit.

For every ``/v1/`` request, before any byte of the body is read:

1. the bearer token is checked (constant-time compare): the node-wide one, or one scoped
   to datasets (:mod:`spoke.serve.admintokens`), whose :class:`Caller` is left in the
   scope's ``state`` for the routes to check against what they act on → 401 JSON;
2. a declared ``Content-Length`` above :data:`MAX_BODY_BYTES` → 413 JSON at once; a body
   sent without a length is counted as it arrives and refused with 413 once it passes the
   cap, so no request ever makes the daemon hold more than the cap in memory;
3. body bytes are charged as they arrive, whatever the headers say (``Content-Length``,
   ``Transfer-Encoding`` or both), and held until the request is answered: at most
   :data:`MAX_BODIES_BYTES` over every caller, half of that for one token, and scoped
   tokens together leave one body's worth (:data:`MAX_BODY_BYTES`) to the operator's →
   503 JSON with ``Retry-After`` beyond: however many connections send bodies slowly, the
   daemon holds at most that much of them (and parses at most a few at once), and
   connections that send headers only hold nothing. Found by issue 39's re-probes: 250
   connections of one scoped token each sending all but the last byte of an 8 MiB hint
   took the daemon from 95 MiB to 2,131 MiB; charging the declared length instead was
   bypassed by ``Content-Length: 0`` with chunked encoding, and let two tokens' headers
   alone refuse everyone's bodies.

``/metrics`` takes the node-wide token only (401 without it, as above; 403 JSON for a
scoped one): it lists every tenant's usage (bytes, reads and hits by team), which a scoped
token's holder may not read any more than ``/v1/cache``. Prometheus scrapes the tokenless
``--metrics`` port, whose app (:func:`spoke.serve.admin.create_metrics_app`) this guard
does not wrap. ``/healthz``, ``/readyz`` and ``/docs`` stay open.

A client that goes away in the middle of its body is one audit line, not a traceback.

FastAPI parses a body before it runs dependencies, which is why these checks cannot be
dependencies. Each ``/v1/`` call that changes something (any method but GET/HEAD) and
every refused token is written to the audit log (:mod:`spoke.audit`) with its outcome.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from spoke.audit import AuditLog
from spoke.serve.admintokens import OPERATOR, Caller, ScopedTokens

CALLER_STATE = "admin_caller"
"""The key under the ASGI scope's ``state`` where the guard leaves the :class:`Caller`
(``request.state.admin_caller`` in a route)."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY_BYTES = 8 << 20
"""Largest admin request body, bytes (a hint of 100,000 paths fits)."""


MAX_BODIES_BYTES = 64 << 20
"""Most bytes of request bodies the admin API holds at once, over every caller (eight
bodies at the cap); one token may hold half of it, scoped tokens together all but one
body's worth."""

METRICS_PATH = "/metrics"
"""Every tenant's usage series (bytes resident and admitted, reads, hits by team): on the
admin port for the node-wide token only; Prometheus scrapes the tokenless ``--metrics``
port (:func:`spoke.serve.admin.create_metrics_app`), which this guard does not wrap."""

METRICS_SCOPED_DETAIL = (
    "/metrics needs the node's admin token (it shows every tenant's usage); a scoped token "
    "may not read it. Prometheus scrapes the spoke's tokenless --metrics port instead"
)

AUDIT_HEAD_BYTES = 4096
_AUDITED_FIELDS = ("dataset", "ref", "all", "pin", "stream", "append")


def _named(head: bytes, total: int) -> dict[str, object]:
    """What a request body named (dataset, ref, ...), for the audit record; paths only
    counted."""
    if not head or len(head) < total:
        return {}
    try:
        body = json.loads(head)
    except ValueError:
        return {}
    if not isinstance(body, dict):
        return {}
    named: dict[str, object] = {k: body[k] for k in _AUDITED_FIELDS if k in body}
    if isinstance(body.get("paths"), list):
        named["paths"] = len(body["paths"])
    return named


async def _json(send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]]) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class AdminGuard:
    """Wraps the admin app.

    Args:
        app: the FastAPI app.
        token: the node-wide bearer token every ``/v1/`` route accepts (the operator's),
            and the only one ``/metrics`` accepts.
        audit: where admin actions and refused tokens are recorded (None: nowhere).
        max_body: the body cap, bytes.
        max_bodies: the most bytes of bodies in flight over every caller
            (:data:`MAX_BODIES_BYTES`); one token may hold half, scoped tokens together
            all but ``max_body``.
        scoped: tokens scoped to datasets (:mod:`spoke.serve.admintokens`); the routes
            decide what their holders may do from the :class:`Caller` left in the scope.
    """

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        audit: AuditLog | None = None,
        max_body: int = MAX_BODY_BYTES,
        scoped: ScopedTokens | None = None,
        max_bodies: int = MAX_BODIES_BYTES,
    ) -> None:
        self.app = app
        self.token = token
        self.audit = audit
        self.max_body = max_body
        self.scoped = scoped
        self.max_bodies = max_bodies
        self.bodies = 0  # bytes of bodies received and not yet answered; one event loop
        self._scoped_bodies = 0  # of them, scoped tokens'
        self._bodies_of: dict[str, int] = {}  # by scoped token's name ("": the operator)

    def _caller(self, scope: Scope) -> Caller | None:
        """Who presented which token: the operator, a scoped token's holder, or None."""
        if self.token is None:
            return OPERATOR
        for key, value in scope.get("headers", []):
            if key == b"authorization":
                scheme, _, presented = value.decode("latin-1").partition(" ")
                if scheme.lower() != "bearer":
                    return None
                presented = presented.strip()
                if secrets.compare_digest(presented.encode(), self.token.encode()):
                    return OPERATOR
                return self.scoped.caller(presented) if self.scoped is not None else None
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point."""
        path = scope.get("path", "")
        metrics = path == METRICS_PATH or path.startswith(METRICS_PATH + "/")
        if scope["type"] != "http" or not (path.startswith("/v1/") or metrics):
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "GET")
        peer = scope.get("client") or ("?", 0)
        who = f"{peer[0]}:{peer[1]}"
        action = f"{method} {path}"
        caller = self._caller(scope)
        if caller is None:
            if self.audit is not None:
                self.audit.refused(who=who, what=action, outcome="denied: missing or wrong token")
            await _json(
                send, 401, "missing or wrong bearer token", [(b"www-authenticate", b"Bearer")]
            )
            return
        if metrics:
            if not caller.operator:
                if self.audit is not None:
                    self.audit.refused(
                        who=f"{who} ({caller.name})", what=action, outcome="denied: scoped token"
                    )
                await _json(send, 403, METRICS_SCOPED_DETAIL, [])
                return
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            await self._too_large(send, who, action)
            return
        await self._serve(scope, receive, send, caller, who, action, method)

    def _room(self, holder: str, amount: int) -> bool:
        """Whether ``amount`` more body bytes fit: in :attr:`max_bodies`, in half of it for
        one token, and, for a scoped token, leaving one body's worth to the operator."""
        if self.bodies + amount > self.max_bodies:
            return False
        if self._bodies_of.get(holder, 0) + amount > self.max_bodies // 2:
            return False
        return not holder or self._scoped_bodies + amount <= self.max_bodies - self.max_body

    def _charge(self, holder: str, amount: int) -> None:
        self.bodies += amount
        if holder:
            self._scoped_bodies += amount
        left = self._bodies_of.get(holder, 0) + amount
        if left:
            self._bodies_of[holder] = left
        else:
            self._bodies_of.pop(holder, None)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        caller: Caller,
        who: str,
        action: str,
        method: str,
    ) -> None:
        received = 0
        too_large = busy = gone = False
        holder = caller.name or ""  # "": the operator's token
        head = bytearray()  # the start of the body, for the audit record

        async def capped() -> Message:
            nonlocal received, too_large, busy, gone
            if too_large or busy:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.disconnect":
                gone = True
            elif message["type"] == "http.request":
                chunk = message.get("body", b"")
                if received + len(chunk) > self.max_body:  # stop reading: a disconnect
                    too_large = True
                    return {"type": "http.disconnect"}
                if not self._room(holder, len(chunk)):  # the bodies in flight are full
                    busy = True
                    return {"type": "http.disconnect"}
                received += len(chunk)
                self._charge(holder, len(chunk))  # held until the request is answered
                if len(head) < AUDIT_HEAD_BYTES:
                    head.extend(chunk[: AUDIT_HEAD_BYTES - len(head)])
            return message

        status = [500]

        async def watch(message: Message) -> None:
            if too_large or busy:
                return  # whatever the app makes of the disconnect, the answer is 413/503
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        scope.setdefault("state", {})[CALLER_STATE] = caller
        if not caller.operator:
            who = f"{who} ({caller.name})"
        try:
            await self.app(scope, capped, watch)
        except Exception:
            if gone and not (too_large or busy):  # the client left mid-body: nobody to answer
                if self.audit is not None:
                    self.audit.refused(who=who, what=action, outcome="client went away")
                return
            if not (too_large or busy):
                raise
        finally:
            self._charge(holder, -received)
        if too_large:
            await self._too_large(send, who, action)
            return
        if busy:
            await self._busy(send, who, action, self._bodies_of.get(holder, 0))
            return
        if self.audit is not None and method not in ("GET", "HEAD"):
            self.audit.record(
                who=who, what=action, outcome=str(status[0]), **_named(bytes(head), received)
            )

    async def _busy(self, send: Send, who: str, action: str, mine: int) -> None:
        if self.audit is not None:
            self.audit.refused(who=who, what=action, outcome="refused: bodies in flight")
        await _json(
            send,
            503,
            f"{self.bodies} bytes of request bodies are being received ({mine} of them "
            f"this token's); this daemon takes at most {self.max_bodies} at once, half for "
            "one token: retry",
            [(b"retry-after", b"1")],
        )

    async def _too_large(self, send: Send, who: str, action: str) -> None:
        if self.audit is not None:
            self.audit.refused(who=who, what=action, outcome="refused: body too large")
        await _json(send, 413, f"request body larger than {self.max_body} bytes", [])
