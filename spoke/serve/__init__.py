"""What the daemon serves to others: the local gRPC service for the mount
(:mod:`~spoke.serve.local`) behind its ``SO_PEERCRED`` front door
(:mod:`~spoke.serve.frontdoor`), the admin API (:mod:`~spoke.serve.admin`, its routers per
resource in :mod:`~spoke.serve.routes`, its server :mod:`~spoke.serve.adminserver` with each
connection's progress :mod:`~spoke.serve.connprogress`, its
token check :mod:`~spoke.serve.adminguard` with the tokens scoped to datasets
:mod:`~spoke.serve.admintokens`, its docs page :mod:`~spoke.serve.admindocs`),
the access log both report reads to (:mod:`~spoke.serve.access`), and the caps on what
clients may hold open (:mod:`~spoke.serve.limits`). It imports :mod:`spoke.mesh`,
:mod:`spoke.prefetch` and the rooms below them.
"""
