"""The spoke's link to its hub: the gRPC client (:mod:`~spoke.hublink.client`), the
credentials it presents and re-reads when their files change
(:mod:`~spoke.hublink.credentials`), and the hub as a block source, with the one place
where the hub's gRPC errors become spoke errors (:mod:`~spoke.hublink.source`). It
imports :mod:`spoke.fetch` and the rooms below it.
"""
