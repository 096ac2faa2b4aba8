"""A volume's own credential: the hub token in its ``nodePublishSecretRef`` secret, checked
against the hub's scope for the dataset, as the hub itself would check it.

A pod's volume may carry a secret (``csi.nodePublishSecretRef``, a Secret of the pod's
namespace: only who may read that namespace's secrets may name it) with a key ``token``:
a hub token of the tenant's. :class:`HubScope` asks the hub whether that token may read the
dataset — one ``ListVersions`` call, which the hub answers only after its token and scope
checks (``PERMISSION_DENIED`` outside the scope, ``UNAUTHENTICATED`` for an unknown or
expired token) — and remembers the answer for :data:`CACHE_S` (a read grant's lifetime), so
a pod's volumes cost at most one hub round trip a minute or two, whatever their number.
Tokens are kept only as their SHA-256, in memory.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from protocol.hub.v1 import hub_pb2, hub_pb2_grpc

CACHE_S = 120.0
"""How long an answer of the hub is reused, seconds (the hub's read grants' lifetime)."""

CALL_TIMEOUT_S = 10.0
"""Longest the hub may take to answer, seconds."""


class HubUnreachable(Exception):
    """The hub could not be asked (the kubelet retries the publish)."""


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
        ca: The CA bundle the hub's certificate is checked against; None for plaintext
            (tests, a trusted network).
        server_name: The name the certificate must carry (defaults to the host).
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        address: str,
        ca: Path | None = None,
        server_name: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        if ca is None:
            self._channel = grpc.insecure_channel(address)
        else:
            credentials = grpc.ssl_channel_credentials(ca.read_bytes())
            self._channel = grpc.secure_channel(address, credentials, options)
        self._stub = hub_pb2_grpc.HubStub(self._channel)
        self._clock = clock
        self._lock = threading.Lock()
        self._answers: dict[tuple[bytes, str], tuple[float, Answer]] = {}

    def check(self, token: str, dataset: str) -> Answer:
        """Whether ``token`` may read ``dataset`` at the hub (cached for :data:`CACHE_S`).

        Raises:
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
        try:
            self._stub.ListVersions(
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
            raise HubUnreachable(f"the hub did not answer: {code.name} {details}") from None
        return Answer(True)

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()
