"""Turning a directory tree into a new version: walking the source through directory
descriptors, never following a link (:mod:`~hub.publish.walk`), resolving the snapshot's
symlinks as the kernel will on a mount (:mod:`~hub.publish.symlinks`), and the publish
itself, streamed in small transactions (:mod:`~hub.publish.tree`). It imports
:mod:`hub.store`, :mod:`hub.catalog`, :mod:`hub.auth` (signatures), :mod:`hub.snapshot`
and the ground leaves; it never imports :mod:`hub.serve`.
"""
