"""How the pieces run together: the local process harness, images, manifests and units.

It imports nothing of :mod:`bench` nor :mod:`demo`; both use it (an import-linter contract).
"""
