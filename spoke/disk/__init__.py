"""The cache on local disk as both processes see it: where its files live and how a block
file is named and read (:mod:`~spoke.disk.layout`), encryption at rest
(:mod:`~spoke.disk.encryption`), the directory's modes and ownership checks
(:mod:`~spoke.disk.hardening`), the mount table (:mod:`~spoke.disk.mountinfo`), the
dataset directories' groups (:mod:`~spoke.disk.datasetgroups`) and the mount hand-over
contract the supervisor and the mount keep (:mod:`~spoke.disk.handover`).
This is the side of the spoke that :mod:`fusemount` may import (with
:mod:`spoke.run.schema`, the mount's settings); it imports nothing else of the spoke but the
top-level leaves (:mod:`spoke.errors`, :mod:`spoke.metrics`, :mod:`spoke.audit`).
"""
