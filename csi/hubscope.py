"""A volume's own credential: the hub token in its ``nodePublishSecretRef`` secret, checked
against the hub's scope for the dataset, as the hub itself would check it.

A pod's volume may carry a secret (``csi.nodePublishSecretRef``, a Secret of the pod's
namespace: only who may read that namespace's secrets may name it) with a key ``token``:
a hub token of the tenant's. :class:`HubScope` asks the hub whether that token may read the
dataset — one ``ListVersions`` call, which the hub answers only after its token and scope
checks (``PERMISSION_DENIED`` outside the scope, ``UNAUTHENTICATED`` for an unknown or
expired token) — and remembers the answer for :data:`CACHE_S` (a read grant's lifetime), so
a pod's volumes cost at most one hub round trip a minute or two, whatever their number.
Tokens are kept only as their SHA-256, in memory. An allow counts only from a hub that
checks tokens: one that lets a token no one holds read the dataset too (a hub without
``--tokens``) refuses every volume token (:data:`OPEN_HUB`; asked once a :data:`CACHE_S`).

The channel is the plugin's own: TLS with the spoke's client certificate against the
shipped hub (:mod:`csi.hubtls`), rebuilt when those files change. A hub that refuses the
plugin in the TLS handshake is :class:`HubRefused`, with one line naming the flag to fix
(the publish fails FAILED_PRECONDITION); one that does not answer is
:class:`HubUnreachable` (UNAVAILABLE). Neither is cached, and neither is ever an allow.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from csi.hubtls import HubTls, HubTlsError, refusal
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc

log = logging.getLogger(__name__)

CACHE_S = 120.0
"""How long an answer of the hub is reused, seconds (the hub's read grants' lifetime)."""

CALL_TIMEOUT_S = 10.0
"""Longest the hub may take to answer, seconds."""

OPEN_HUB = (
    "the hub checks no tokens (it runs without --tokens), so a volume's token vouches for "
    "nothing: give the hub its tokens, or publish by the tenancy policy (no secret)"
)
"""Why a volume's token is refused by a hub that accepts any."""


class HubUnreachable(Exception):
    """The hub could not be asked (the kubelet retries the publish)."""


class HubRefused(Exception):
    """The hub refused this plugin's connection (TLS: its trust, its client certificate):
    a setting to fix, said in one line."""


@dataclass(frozen=True)
class Answer:
    """The hub's answer for a token and a dataset.

    Attributes:
        allowed: Whether the token may read the dataset.
        reason: The hub's words when not.
    """

    allowed: bool
    reason: str = ""


class HubScope:
    """Asks the hub whether a volume's token may read a dataset, and remembers it.

    Args:
        address: The hub, ``HOST:PORT`` (as the spokes dial it).
        tls: TLS to the hub (:mod:`csi.hubtls`); None for plaintext (tests, a trusted
            network).
        clock: Monotonic seconds (tests pass their own).

    Raises:
        HubTlsError: a TLS file is missing, malformed, expired or mismatched.
    """

    def __init__(
        self,
        address: str,
        tls: HubTls | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address, self.tls = address, tls
        self._clock = clock
        self._lock = threading.Lock()
        self._answers: dict[tuple[bytes, str], tuple[float, Answer]] = {}
        self._any, self._any_until = False, float("-inf")  # accepts any token? until when
        self._stamp = tls.stamp() if tls is not None else None
        self._warned: tuple[object, ...] | None = None
        self._channel = self._open(tls.credentials() if tls is not None else None)
        self._stub = hub_pb2_grpc.HubStub(self._channel)

    def _open(self, credentials: grpc.ChannelCredentials | None) -> grpc.Channel:
        if credentials is None or self.tls is None:
            return grpc.insecure_channel(self.address)
        return grpc.secure_channel(self.address, credentials, self.tls.options())

    def _current_stub(self) -> hub_pb2_grpc.HubStub:
        """The stub, on a new channel when the TLS files changed and are whole again (a
        half-renewed pair keeps the current one, with one warning)."""
        if self.tls is None:
            return self._stub
        stamp = self.tls.stamp()
        with self._lock:
            if stamp == self._stamp:
                return self._stub
            try:
                credentials = self.tls.credentials()
            except HubTlsError as err:
                if stamp != self._warned:
                    log.warning("not switching the hub's TLS files yet: %s", err)
                    self._warned = stamp
                return self._stub
            self._stamp = stamp
            self._channel = self._open(credentials)  # the old one closes when unused
            self._stub = hub_pb2_grpc.HubStub(self._channel)
            log.info("the hub's TLS files changed; new calls use them")
            return self._stub

    def check(self, token: str, dataset: str) -> Answer:
        """Whether ``token`` may read ``dataset`` at the hub (cached for :data:`CACHE_S`).

        Raises:
            HubRefused: the hub refused this plugin in the TLS handshake (not cached).
            HubUnreachable: the hub did not answer (not cached: asked again next time).
        """
        key = (hashlib.sha256(token.encode()).digest(), dataset)
        now = self._clock()
        with self._lock:
            cached = self._answers.get(key)
            if cached is not None and cached[0] > now:
                return cached[1]
        answer = self._ask(token, dataset)
        with self._lock:
            self._answers = {k: v for k, v in self._answers.items() if v[0] > now}
            self._answers[key] = (now + CACHE_S, answer)
        return answer

    def _ask(self, token: str, dataset: str) -> Answer:
        answer = self._list(token, dataset)
        if answer.allowed and self._accepts_any(dataset):
            return Answer(False, OPEN_HUB)
        return answer

    def _accepts_any(self, dataset: str) -> bool:
        """Whether the hub lets a token no one holds read ``dataset``: a hub without
        ``--tokens`` answers every call as anonymous, so its allow vouches for nothing (the
        sixteenth probe: any string as a volume's token published any dataset). Asked once
        per :data:`CACHE_S`."""
        now = self._clock()
        with self._lock:
            if self._any_until > now:
                return self._any
        nobody = "strata-csi-no-such-token-" + secrets.token_hex(16)
        is_open = self._list(nobody, dataset).allowed
        with self._lock:
            self._any, self._any_until = is_open, now + CACHE_S
        if is_open:
            log.warning("hub %s accepts a token no one holds: %s", self.address, OPEN_HUB)
        return is_open

    def _list(self, token: str, dataset: str) -> Answer:
        try:
            self._current_stub().ListVersions(
                hub_pb2.ListVersionsRequest(dataset=dataset),
                metadata=(("authorization", f"Bearer {token}"),),
                timeout=CALL_TIMEOUT_S,
            )
        except grpc.RpcError as err:
            code = err.code()  # type: ignore[attr-defined]
            details = err.details()  # type: ignore[attr-defined]
            if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                return Answer(False, f"the hub: {details}")
            if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                return Answer(True)  # within the scope; the publish finds it missing
            if code == grpc.StatusCode.UNAVAILABLE:
                reason = refusal(self.tls, details or "")
                if reason is not None:
                    raise HubRefused(f"hub {self.address}: {reason}") from None
            raise HubUnreachable(
                f"hub {self.address} did not answer: {code.name} {details}"
            ) from None
        return Answer(True)

    def greet(self, timeout: float = CALL_TIMEOUT_S) -> str | None:
        """Ask the hub's health service (no token needed) whether this plugin gets through:
        None when it does, else the one-line reason (the TLS refusal, or the hub's silence).
        Run once at start, so a missing client certificate is in the log before any pod
        asks."""
        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as err:
            code = err.code()  # type: ignore[attr-defined]
            details = err.details() or ""  # type: ignore[attr-defined]
            reason = refusal(self.tls, details) if code == grpc.StatusCode.UNAVAILABLE else None
            return f"hub {self.address}: {reason or f'{code.name} {details}'}"
        return None

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()
