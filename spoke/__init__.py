"""The spoke: a block cache on local disk in front of a hub, and the daemon that fills it.

Its rooms, from the top floor down (each one's ``__init__`` says what it owns; a room
imports only the rooms below it): :mod:`spoke.run`, :mod:`spoke.serve`, :mod:`spoke.mesh`
beside :mod:`spoke.prefetch`, :mod:`spoke.upkeep`, :mod:`spoke.catalog`,
:mod:`spoke.hublink`, :mod:`spoke.fetch`, :mod:`spoke.cache`, :mod:`spoke.disk`, and under
them :mod:`spoke.errors`, :mod:`spoke.metrics` and :mod:`spoke.audit`. The mount
(:mod:`fusemount`) imports only :mod:`spoke.disk` (where cache files live, how to read a
block, the hand-over contract) and the mount's settings (:mod:`spoke.run.schema`): an
allow-list contract in ``pyproject.toml``; nothing of the spoke imports the mount. Everything
else runs only in the supervisor and the daemon (see ``spoke/DESIGN.md``).
"""
