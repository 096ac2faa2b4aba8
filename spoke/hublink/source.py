"""The hub as a :class:`~spoke.fetch.source.BlockSource`, and the one place where the hub's
gRPC errors become spoke errors (:func:`hub_error`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc
import grpc.aio

from spoke import metrics
from spoke.errors import AccessDenied, HubUnavailable, InvalidRequest, NotFound, SpokeError
from spoke.fetch.priority import Priority
from spoke.hublink.client import HubClient

OFFLINE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
    }
)
"""gRPC codes that mean "the hub could not be reached", not "the hub said no"."""


def hub_error(err: grpc.aio.AioRpcError, target: str, refused: str | None = None) -> SpokeError:
    """The spoke error for a failed hub call (and the hub-up gauge set to match).

    ``NOT_FOUND`` → :class:`NotFound`; ``INVALID_ARGUMENT`` → :class:`InvalidRequest`
    (the hub answered: it is up); ``PERMISSION_DENIED`` (a dataset outside this spoke's
    token scope) → :class:`AccessDenied`; unreachable codes (:data:`OFFLINE_CODES`) and every
    other code → :class:`HubUnavailable`, which callers retry or serve from the index.

    Args:
        err: the failed call.
        target: the hub's ``HOST:PORT``, for the message.
        refused: :attr:`HubClient.refused` — why the hub refused this spoke's credentials
            (a bad token, a TLS failure), the message of a :class:`HubUnavailable` if set.
    """
    return status_error(err.code(), err.details(), target, refused)


def status_error(
    code: grpc.StatusCode, details: str | None, target: str, refused: str | None = None
) -> SpokeError:
    """The spoke error for a hub status ``code`` with its message, from a gRPC call
    (:func:`hub_error`) or the bulk channel (:mod:`spoke.hublink.bulk`), which carries
    the same codes."""
    details = details or code.name.lower().replace("_", " ")
    if code == grpc.StatusCode.NOT_FOUND:
        metrics.HUB_UP.set(1)
        return NotFound(details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        metrics.HUB_UP.set(1)
        return InvalidRequest(details)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        metrics.HUB_UP.set(1)
        return AccessDenied(details)
    if refused is not None:  # token or TLS refused: the hub is not usable now
        metrics.HUB_UP.set(0)
        return HubUnavailable(refused)
    metrics.HUB_UP.set(0 if code in OFFLINE_CODES else 1)
    if code in OFFLINE_CODES:
        return HubUnavailable(f"hub {target} unavailable: {details}")
    return HubUnavailable(f"hub {target} error {code.name}: {details}")


class HubSource:
    """The hub as a :class:`~spoke.fetch.source.BlockSource` (one ``ReadBlocks`` stream per call).

    Args:
        hub: the hub client.
    """

    def __init__(self, hub: HubClient) -> None:
        self.hub = hub

    @property
    def name(self) -> str:
        """The hub's ``HOST:PORT``."""
        return self.hub.target

    async def read_blocks(
        self, blocks: Sequence[tuple[str, int]], timeout: float, priority: Priority
    ) -> AsyncIterator[tuple[str, bytes]]:
        """As :meth:`~spoke.fetch.source.BlockSource.read_blocks`; failed attempts are counted
        by gRPC code (the hub is asked for the digests; it knows their sizes, and serves
        every class alike)."""
        try:
            async for digest, data in self.hub.read_blocks([d for d, _ in blocks], timeout):
                # counted here, where only the hub's blocks pass (not in the fetcher, which
                # also sees the mesh's: peers' are strata_spoke_source_bytes{source="peer"})
                metrics.HUB_FETCH_BYTES.inc(len(data))
                metrics.HUB_FETCH_BLOCKS.inc()
                yield digest, data
            metrics.HUB_UP.set(1)
        except grpc.aio.AioRpcError as err:
            metrics.HUB_FETCH_ERRORS.labels(err.code().name).inc()
            raise hub_error(err, self.name, self.hub.refused) from err
        except ValueError as err:  # out of order or inconsistent chunk offsets
            metrics.HUB_FETCH_ERRORS.labels("OUT_OF_ORDER").inc()
            raise HubUnavailable(f"hub {self.name}: {err}") from err
