"""The read-only FUSE mount (pyfuse3 on trio): ``MOUNT/<dataset>/<version>/…`` and
``MOUNT/<dataset>/<tag> -> <version>``. Concurrency rules: ``fusemount/DESIGN.md``.
"""
