"""The regional spoke mesh: each block crosses the WAN once per region, not once per node.

The spokes of a region agree, without talking about it, on an owner for every block
(rendezvous hashing over the live spokes, :mod:`spoke.mesh.rendezvous`). A spoke that
misses asks the owner (:mod:`spoke.mesh.source`) before the hub; the owner serves the block
from its cache or fetches it from the hub once for the whole region
(:mod:`spoke.mesh.peerservice`). Membership and health probes: :mod:`spoke.mesh.membership`.
"""
