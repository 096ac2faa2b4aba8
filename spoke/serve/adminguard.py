"""The admin API's front door (pure ASGI, ahead of FastAPI): token, body cap, audit.

For every ``/v1/`` request, before any byte of the body is read:

1. the bearer token is checked (constant-time compare): the node-wide one, or one scoped
   to datasets (:mod:`spoke.serve.admintokens`), whose :class:`Caller` is left in the
   scope's ``state`` for the routes to check against what they act on → 401 JSON;
2. a declared ``Content-Length`` above :data:`MAX_BODY_BYTES` → 413 JSON at once; a body
   sent without a length is counted as it arrives and refused with 413 once it passes the
   cap, so no request ever makes the daemon hold more than the cap in memory.

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
        token: the node-wide bearer token every ``/v1/`` route accepts (the operator's).
        audit: where admin actions and refused tokens are recorded (None: nowhere).
        max_body: the body cap, bytes.
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
    ) -> None:
        self.app = app
        self.token = token
        self.audit = audit
        self.max_body = max_body
        self.scoped = scoped

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
        if scope["type"] != "http" or not path.startswith("/v1/"):
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
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            await self._too_large(send, who, action)
            return
        received = 0
        too_large = False
        head = bytearray()  # the start of the body, for the audit record

        async def capped() -> Message:
            nonlocal received, too_large
            if too_large:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                received += len(chunk)
                if received > self.max_body:  # stop reading; the app sees a disconnect
                    too_large = True
                    return {"type": "http.disconnect"}
                if len(head) < AUDIT_HEAD_BYTES:
                    head.extend(chunk[: AUDIT_HEAD_BYTES - len(head)])
            return message

        status = [500]

        async def watch(message: Message) -> None:
            if too_large:
                return  # whatever the app makes of the disconnect, the answer is 413
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        scope.setdefault("state", {})[CALLER_STATE] = caller
        if not caller.operator:
            who = f"{who} ({caller.name})"
        try:
            await self.app(scope, capped, watch)
        except Exception:
            if not too_large:
                raise
        if too_large:
            await self._too_large(send, who, action)
            return
        if self.audit is not None and method not in ("GET", "HEAD"):
            self.audit.record(
                who=who, what=action, outcome=str(status[0]), **_named(bytes(head), received)
            )

    async def _too_large(self, send: Send, who: str, action: str) -> None:
        if self.audit is not None:
            self.audit.refused(who=who, what=action, outcome="refused: body too large")
        await _json(send, 413, f"request body larger than {self.max_body} bytes", [])
