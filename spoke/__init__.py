"""The spoke: a block cache on local disk in front of a hub, and the daemon that fills it.

Its rooms, from the top floor down (each one's ``__init__`` says what it owns; a room
imports only the rooms below it): :mod:`spoke.run`, :mod:`spoke.serve`, :mod:`spoke.mesh`
beside :mod:`spoke.prefetch`, :mod:`spoke.upkeep`, :mod:`spoke.catalog`,
:mod:`spoke.hublink`, :mod:`spoke.fetch`, :mod:`spoke.cache`, :mod:`spoke.disk`, and under
them :mod:`spoke.errors`, :mod:`spoke.metrics` and :mod:`spoke.audit`. The mount imports
only :mod:`spoke.disk` (where cache files live and how to read a block) and those leaves;
everything else runs only in the spoke daemon (see ``spoke/DESIGN.md``).
"""
