"""The regional spoke mesh: each block crosses the WAN once per region, not once per node.

The spokes of a region agree, without talking about it, on an owner for every block
(rendezvous hashing over the live spokes, :mod:`spoke.mesh.rendezvous`). A spoke that
misses asks the owner (:mod:`spoke.mesh.source`) before the hub; the owner serves the block
from its cache or fetches it from the hub once for the whole region
(:mod:`spoke.mesh.peerservice` over gRPC; with ``--peer-bulk-port`` the bytes take the bulk
channel, :mod:`spoke.mesh.peerbulk` and :mod:`spoke.mesh.bulkclient`, admitted by the same
code, :mod:`spoke.mesh.peercall`). Membership and health probes: :mod:`spoke.mesh.membership`.
A block the whole region wants at once (a job's first batch) leaves its owner at most about
sixteen times: the owner sends the rest of its askers to their relays, a tree of fan-out
8 over the spokes in rendezvous order (:mod:`spoke.mesh.relay`).

Trust: a spoke proves its dataset scope with a hub-signed read grant and a proof of
possession (:mod:`spoke.mesh.grants`, checked by :mod:`spoke.mesh.grantcheck`); an owner
serves only its own live snapshots' blocks the grant covers (:mod:`spoke.mesh.admission`),
over TLS with the region's token (:mod:`spoke.mesh.transport`).

It imports :mod:`spoke.upkeep` and the rooms below it (the scheduler it fetches through,
the cache it serves from, the catalog that says what it may serve), never
:mod:`spoke.prefetch` (its sibling).
"""
