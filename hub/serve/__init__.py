"""Serving snapshots: the gRPC server and its lifecycle (:mod:`~hub.serve.server`, on a thread
in :mod:`~hub.serve.serverthread`; its limits and TLS in :mod:`~hub.serve.config`), the door
that authenticates a call before any request byte is read (:mod:`~hub.serve.gate`),
receiving requests within deadlines (:mod:`~hub.serve.inbound`), the handler wrappers
(:mod:`~hub.serve.calls`) and the servicer (:mod:`~hub.serve.service`), a ``ReadBlocks``
stream's blocks (:mod:`~hub.serve.blockstream`) and their timed sends
(:mod:`~hub.serve.sending`), the bulk channel beside gRPC (:mod:`~hub.serve.bulk`, its
sockets in :mod:`~hub.serve.bulksocket`), what crosses the wire (:mod:`~hub.serve.wire`),
noticing catalog changes and a ``Watch`` call's events (:mod:`~hub.serve.watch`), metrics
(:mod:`~hub.serve.metrics`, their HTTP endpoint :mod:`~hub.serve.metricsendpoint`) and
listen addresses (:mod:`~hub.serve.address`). It imports
every room below it (:mod:`hub.limits`, :mod:`hub.auth`, :mod:`hub.store`,
:mod:`hub.catalog`, :mod:`hub.snapshot`), never :mod:`hub.publish` or :mod:`hub.cli`.
"""
