"""The spoke: a block cache on local disk in front of a hub, and the daemon that fills it.

Read-side modules the mount may import: :mod:`spoke.disk.layout` (where cache files live and how
to read a block). Everything else runs only in the spoke daemon (see ``spoke/DESIGN.md``).
"""
