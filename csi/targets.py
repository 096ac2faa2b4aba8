"""Where the plugin may publish: directories below the kubelet's pods directory, reached
without following a symlink at any component.

The kubelet hands NodePublishVolume a ``target_path`` of the form
``PODS/POD_UID/volumes/kubernetes.io~csi/NAME/mount`` (its parent made, the target not).
The plugin runs as root and mounts there, so a path it was not given by the kubelet — a
directory elsewhere, a ``..``, a symlinked component that a pod's author made in a volume
it shares, or a component swapped for one while the call runs — must never become a bind
mount, nor lose an unmount or a directory. So a target is

- checked as text first: absolute, normalised (no ``.``, ``..`` or ``//``), below the
  pods directory (``--pods-dir``, the kubelet's ``--root-dir`` + ``/pods``) in the shape the
  kubelet gives, ``POD_UID/volumes/kubernetes.io~csi/NAME/mount`` (so never a pod's own
  directory, its ``volumes/`` or ``etc-hosts``);
- then reached by directory descriptors (``O_PATH | O_NOFOLLOW | O_DIRECTORY``, each opened
  relative to the one before, from the pods directory opened once), so a symlink at any
  component below the pods directory fails the walk (``ELOOP`` / ``ENOTDIR``) and is
  refused, as ``strata-hub publish`` walks its sources (``hub/publish/walk.py``);
- and mounted on, or unmounted, through ``/proc/self/fd/N`` of the descriptor the walk
  ended with, so a component swapped after the walk changes nothing the call does.

The pods directory itself may sit behind symlinks the operator chose (``/var/lib/kubelet``
on another disk): it is resolved once, at start, and a target may name it either way.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

PODS_DIR = Path("/var/lib/kubelet/pods")
"""The kubelet's pods directory with its default ``--root-dir``."""

_WALK = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC

SHAPE = ("*", "volumes", "kubernetes.io~csi", "*", "mount")
"""A target's components below the pods directory, as the kubelet makes them for a CSI
volume (Kubernetes ``pkg/volume/csi``, ``csi_mounter.go`` and ``GetCSIMounterPath``:
``PODS/UID/volumes/kubernetes.io~csi/NAME/mount``);
``*`` is any one name."""


class TargetRefused(ValueError):
    """A target path the plugin may not touch (gRPC INVALID_ARGUMENT)."""


class Targets:
    """The targets below one pods directory.

    Args:
        pods_dir: The kubelet's pods directory (absolute).

    Raises:
        TargetRefused: ``pods_dir`` is not an absolute path.
    """

    def __init__(self, pods_dir: Path = PODS_DIR) -> None:
        if not pods_dir.is_absolute():
            raise TargetRefused(f"--pods-dir must be an absolute path, not {str(pods_dir)!r}")
        self.given = Path(os.path.normpath(pods_dir))
        self.root = Path(os.path.realpath(pods_dir))

    def canonical(self, target_path: str) -> Path:
        """``target_path`` as the plugin names it: below the resolved pods directory.

        Raises:
            TargetRefused: not absolute, not normalised, not below the pods directory, or
                not of the kubelet's shape there (:data:`SHAPE`).
        """
        if not target_path.startswith("/") or os.path.normpath(target_path) != target_path:
            raise TargetRefused(
                f"target_path must be an absolute, normalised path (no '.', '..' or '//'), "
                f"not {target_path!r}"
            )
        for base in (self.given, self.root):
            relative = os.path.relpath(target_path, base)
            if relative != "." and not relative.startswith(".."):
                return self._shaped(target_path, self.root / relative)
        raise TargetRefused(
            f"target_path {target_path!r} is not below the kubelet's pods directory "
            f"{self.given} (--pods-dir): this plugin publishes only where the kubelet asks"
        )

    def _shaped(self, target_path: str, target: Path) -> Path:
        parts = target.relative_to(self.root).parts
        if len(parts) != len(SHAPE) or any(
            want not in ("*", got) for want, got in zip(SHAPE, parts, strict=True)
        ):
            raise TargetRefused(
                f"target_path {target_path!r} is not a CSI volume's target as the kubelet "
                f"makes it ({self.given}/POD_UID/volumes/kubernetes.io~csi/NAME/mount): refused"
            )
        return target

    @contextlib.contextmanager
    def parent(self, target: Path) -> Iterator[int]:
        """A descriptor (``O_PATH``) of ``target``'s parent, a :meth:`canonical` path,
        reached from the pods directory without following a symlink.

        Raises:
            TargetRefused: a component is a symlink or not a directory.
            FileNotFoundError: a component does not exist.
        """
        parts = target.relative_to(self.root).parts[:-1]
        fd = os.open(self.root, _WALK)
        try:
            for name in parts:
                try:
                    child = os.open(name, _WALK, dir_fd=fd)
                except OSError as err:
                    if err.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise TargetRefused(
                            f"target_path {str(target)!r} has a component {name!r} that is a "
                            "symlink or no directory: refused"
                        ) from None
                    raise
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    @staticmethod
    def open_at(parent: int, target: Path) -> int:
        """A descriptor (``O_PATH``) of ``target`` itself, opened in ``parent`` without
        following it; a mount on ``target`` is crossed into (its root is returned).

        Raises:
            TargetRefused: ``target`` is a symlink or no directory.
            FileNotFoundError: it does not exist.
        """
        try:
            return os.open(target.name, _WALK, dir_fd=parent)
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.ENOTDIR):
                raise TargetRefused(
                    f"target_path {str(target)!r} is a symlink or no directory: refused"
                ) from None
            raise


def fd_path(fd: int, name: str = "") -> Path:
    """A path naming what descriptor ``fd`` refers to (with ``name``: that entry of the
    directory ``fd`` is), for mount(2) and umount2(2): proc(5), ``/proc/PID/fd``, links the
    kernel follows to the object itself, not by the name it had."""
    return Path(f"/proc/self/fd/{fd}" + (f"/{name}" if name else ""))
