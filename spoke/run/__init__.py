"""Running a spoke: the ``strata-spoke`` command line (:mod:`~spoke.run.cli`), the one
schema of every option (:mod:`~spoke.run.settings`, and :mod:`~spoke.run.schema`, which the
mount imports for its part), the supervisor that keeps the daemon and the mount up as two
processes (:mod:`~spoke.run.supervisor` over :mod:`~spoke.run.children`, with
:mod:`~spoke.run.startup`, :mod:`~spoke.run.workers`, :mod:`~spoke.run.processes`,
:mod:`~spoke.run.process` and the cache directory's :mod:`~spoke.run.lock`) and hands the
whole spoke to a new one (:mod:`~spoke.run.succession`), and the daemon's composition
root that builds every component (:mod:`~spoke.run.daemon`). It is the top floor: it may
import every room, and no room imports it.
"""
