"""The spoke's link to its hub: the gRPC client (:mod:`~spoke.hublink.client`), the
credentials it presents and re-reads when their files change
(:mod:`~spoke.hublink.credentials`), and the hub as a block source, with the one place
where the hub's gRPC errors become spoke errors (:mod:`~spoke.hublink.source`), and the
hub's bulk block channel as a block source received by worker threads
(:mod:`~spoke.hublink.bulk`). It imports :mod:`spoke.fetch` and the rooms below it.
"""
