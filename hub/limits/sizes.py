"""What a client may make the hub hold before it has proven anything: connections, TLS
handshakes, idle connections and streams, as gRPC core channel arguments
(https://grpc.github.io/grpc/core/group__grpc__arg__keys.html), and how the hub's memory
allocator gives back what those cost.

An unauthenticated TCP connection costs the hub about 45 KiB while its TLS handshake is
pending and about 12 KiB on a plaintext port (measured: 12,000 idle connections to a TLS
port with no limits held it at 612 MiB after they closed, 1,168 MiB after three rounds).
So:

- at most ``max_connections`` connections are open at once
  (``grpc.max_allowed_incoming_connections``); gRPC core closes every connection beyond
  it as it accepts it, before any handshake. Spokes hold one connection each (two for
  the two minutes after a certificate renewal, :mod:`spoke.hublink.client`), so the default
  serves about a thousand spokes; a larger region raises ``--max-connections``.
- a connection that has not finished its TLS handshake and sent its HTTP/2 settings
  within ``handshake_timeout_s`` is closed (``grpc.server_handshake_timeout_ms``, 120 s
  in gRPC core): a slot held by a silent client frees within seconds. A TLS 1.3
  handshake takes one round trip, the settings another.
- a connection with no call for :data:`IDLE_S` is closed with a GOAWAY
  (``grpc.max_connection_idle_ms``); a spoke's Watch stream keeps its own connection busy,
  and clients reconnect on their next call.
- one connection carries at most :data:`MAX_STREAMS` calls at once
  (``grpc.max_concurrent_streams``; RFC 9113 section 5.1.2 suggests no fewer than 100);
  a client queues calls beyond it.

``grpc.max_connection_age_ms`` is not set: it would end every spoke's Watch stream and
long block streams on a timer, and the limits above already bound what a connection
costs. gRPC core has no per-address limit, and Python sees no connection before its
handshake, so one host can take every slot; a per-address limit belongs in front of the
hub (a firewall's connection limit, a Kubernetes NetworkPolicy). Connections open before
a flood keep working through it.

``serve`` also limits glibc's malloc arenas before gRPC starts its threads
(:func:`strata_local.memory.limit_malloc_arenas`): after each flood of handshakes the hub
kept more without it.
"""

from __future__ import annotations

MAX_CONNECTIONS = 2048
"""Default most connections open at once (``--max-connections``)."""

HANDSHAKE_TIMEOUT_S = 10.0
"""Default longest a connection may take to finish its TLS handshake and send its HTTP/2
settings, seconds (``--handshake-timeout``): a few round trips over a long link, with room
for a hub busy with many spokes reconnecting at once."""

IDLE_S = 60.0
"""A connection without a call for this long is closed (GOAWAY), seconds."""

MAX_STREAMS = 256
"""Most calls one connection carries at once (a spoke uses up to 16 block streams, its
Watch stream and catalog calls)."""


def connection_options(
    max_connections: int = MAX_CONNECTIONS, handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
) -> tuple[tuple[str, int], ...]:
    """gRPC core options that bound what clients may hold open.

    Args:
        max_connections: Most connections open at once.
        handshake_timeout_s: Longest a handshake (TLS and HTTP/2 settings) may take, seconds.

    Returns:
        ``(name, value)`` pairs for :func:`grpc.aio.server`.
    """
    return (
        ("grpc.max_allowed_incoming_connections", max_connections),
        ("grpc.server_handshake_timeout_ms", max(1, round(handshake_timeout_s * 1000))),
        ("grpc.max_connection_idle_ms", round(IDLE_S * 1000)),
        ("grpc.max_concurrent_streams", MAX_STREAMS),
    )
