"""Prometheus metrics of the regional mesh (default registry, one daemon per process)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

SOURCE_BYTES = Counter(
    "strata_spoke_source_bytes",
    "Verified block bytes fetched, by where they came from (hub, peer)",
    ["source"],
)
SOURCE_BLOCKS = Counter(
    "strata_spoke_source_blocks", "Verified blocks fetched, by source (hub, peer)", ["source"]
)
SOURCE_SECONDS = Histogram(
    "strata_spoke_source_seconds",
    "Duration of one block stream, by source (hub, peer), seconds",
    ["source"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
ROUTED_BLOCKS = Counter(
    "strata_spoke_mesh_routed_blocks",
    "Fetched blocks by owner: self (fetched from the hub), peer (asked of their owner), "
    "relay (asked of this spoke's relay for them: a peer asked this spoke as its relay)",
    ["owner"],
)
PEER_ERRORS = Counter(
    "strata_spoke_peer_errors",
    "Peer calls that failed and fell back to the hub, by kind "
    "(unavailable, timeout, slow, deadline, corrupt, lying, refused, protocol, "
    "resource_exhausted, ...)",
    ["kind"],
)
PEER_QUARANTINES = Counter(
    "strata_spoke_peer_quarantines",
    "Peers left out of the mesh for a quarantine, by why: corrupt (a block failed "
    "verification), lying (a block broke its size), slow (fell behind the pace), timeout "
    "(sent nothing for --peer-timeout)",
    ["kind"],
)
PEER_CORRUPT_BLOCKS = Counter(
    "strata_spoke_peer_corrupt_blocks",
    "Blocks from a peer that failed verification (dropped and fetched from the hub)",
)
PEER_SERVED_BYTES = Counter(
    "strata_spoke_peer_served_bytes",
    "Block bytes served to other spokes, by how this spoke had them (cache, fetched)",
    ["how"],
)
PEER_BULK_BYTES = Counter(
    "strata_spoke_peer_bulk_bytes",
    "Block bytes sent to other spokes over the bulk peer port (--peer-bulk-port), by how "
    "(sendfile, written)",
    ["how"],
)
PEERS_LIVE = Gauge("strata_spoke_mesh_nodes_live", "Spokes of the mesh seen live, self included")
OWNED_SHARE = Gauge(
    "strata_spoke_mesh_owned_share", "Share of the blocks this spoke owns (1 / live nodes)"
)
PEER_REFUSALS = Counter(
    "strata_spoke_peer_refusals",
    "Peer calls this spoke refused, whole or in part, by reason (token, no_grant, expired, "
    "wrong_target, replayed, busy, declined, limit, memory, ...; spoke/mesh/grantcheck.py)",
    ["reason"],
)
PEER_HELD_BYTES = Gauge(
    "strata_spoke_peer_held_bytes",
    "Bytes the peer port holds for callers now (spoke/mesh/admission.py MemoryBudget)",
)
PEER_REFUSED_BLOCKS = Counter(
    "strata_spoke_peer_refused_blocks",
    "Blocks this spoke declined to serve to a peer (in no live snapshot stored here, or "
    "only in ones outside the caller's grant: which, only the audit log says)",
)
PEER_DECLINED_BLOCKS = Counter(
    "strata_spoke_peer_declined_blocks",
    "Blocks a peer declined to serve this spoke (fetched from the hub in the same call)",
)
PEER_CREDENTIAL_RELOADS = Counter(
    "strata_spoke_peer_credential_reloads",
    "Peer credentials re-read after their files changed (what: tls or token)",
    ["what"],
)
GRANT_REFRESHES = Counter(
    "strata_spoke_grant_refreshes",
    "Read grant requests to the hub, by outcome (ok, failed)",
    ["outcome"],
)
GRANT_EXPIRY = Gauge(
    "strata_spoke_grant_expiry_timestamp_seconds",
    "When this spoke's read grant expires (Unix time, hub clock)",
)
RELAY_REDIRECTED_BLOCKS = Counter(
    "strata_spoke_mesh_relay_redirected_blocks",
    "Hot blocks this spoke, as their owner, did not send a caller but sent it to its relay "
    "for (asked for by 8 other spokes lately; spoke/mesh/relay.py)",
)
RELAY_HINTED_BLOCKS = Counter(
    "strata_spoke_mesh_relay_hinted_blocks",
    "Blocks an owner sent this spoke to its relay for (then asked of the relay)",
)
RELAY_RECEIVED_BLOCKS = Counter(
    "strata_spoke_mesh_relay_received_blocks",
    "Verified blocks this spoke received from its relay (the rest came from the hub)",
)
RELAY_SERVED_BLOCKS = Counter(
    "strata_spoke_mesh_relay_served_blocks",
    "Blocks this spoke served as a relay (a relay request), by how it had them (cache, "
    "fetched: from its own relay or the owner)",
    ["how"],
)
