"""What a caller may make the hub hold: connections, handshakes and idle streams before it
has proven anything (:mod:`~hub.limits.sizes`, as gRPC core channel arguments), each
token's share of the bytes its block streams hold (:mod:`~hub.limits.budget`) and of the
``GetManifest``, ``Watch`` and unary slots (:mod:`~hub.limits.streams`), with every kind's
last slots kept for tokens holding few (:mod:`~hub.limits.slots`), and the bytes of
replies waiting for their clients (:mod:`~hub.limits.replies`); turns at the page
builds, shared one token at a time (:mod:`~hub.limits.turns`). Pure accounting:
it imports :mod:`hub.snapshot` and the ground leaves, never gRPC's server or the catalog.
"""
