"""Publishing one snapshot version of a dataset at a target path, and taking it away.

A volume names a dataset and a ref (a version like ``v3`` or a tag like ``latest``).
Publishing resolves the ref **once**, through the spoke's mount (``MOUNT/DATASET/TAG`` is a
symlink to the version's directory, DESIGN.md "Data flow"), and bind-mounts that version's
directory read-only at the target: a snapshot is immutable, so the pod sees the same bytes
for its whole life while the tag moves on. The ref's answer is recorded in the state
directory (one JSON file per target), so a repeated publish of the same volume keeps the
version it got first instead of asking again.

Idempotence, as the CSI spec asks of NodePublishVolume and NodeUnpublishVolume: publishing
what a target already holds succeeds and changes nothing; publishing something else on an
occupied target, another volume id included, is :class:`TargetTaken` (and the target's record
stays the first volume's); unpublishing a target that is not there succeeds.
What a target holds is read from the mount table (its device is the spoke mount's, its
root ``/DATASET/VERSION``), never by ``stat`` of the target, which a dead mount would fail.

Calls for one target are serialised; calls for different targets run side by side.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from csi.mounttable import (
    Mount,
    bind,
    detach,
    make_read_only,
    mounted_at,
    resolve_target,
    unmount,
)
from csi.records import Publication, StateDir
from csi.targets import TargetRefused, Targets, fd_path

log = logging.getLogger(__name__)

MAX_POD_VOLUMES = 64
"""Most volumes of this plugin one pod holds at once."""

MAX_NAMESPACE_VOLUMES = 256
"""Most volumes of this plugin the pods of one namespace hold on the node at once: a
quarter of the node's, so one namespace's pods cannot take them all from the others (the
eighteenth probe: one namespace's 16 pods of 64 volumes left every other tenant's pod on
the node RESOURCE_EXHAUSTED)."""

MAX_NODE_VOLUMES = 1024
"""Most volumes of this plugin on the node at once (``NodeGetInfo``'s
``max_volumes_per_node``). Each publish reads the mount table, so its cost grows with the
binds there: one pod's 2,000 inline volumes took another pod's publish from 11 to 54 ms,
and their unpublish 17 s (issue 39's seventeenth probe)."""

MOUNT_FSTYPE = "fuse.strata"
"""The spoke mount's type in the mount table (``subtype=strata``, fusemount/cli.py)."""


class VolumeError(Exception):
    """A volume could not be published or unpublished (the message says why)."""


class InvalidVolume(VolumeError):
    """The request names no valid volume or target (gRPC INVALID_ARGUMENT)."""


class NoSuchSnapshot(VolumeError):
    """The dataset, or its version or tag, does not exist (gRPC NOT_FOUND)."""


class Denied(VolumeError):
    """The pod may not mount this dataset (:mod:`csi.tenancy`; gRPC PERMISSION_DENIED)."""


class TargetTaken(VolumeError):
    """The target already holds another volume (gRPC ALREADY_EXISTS)."""


class TargetNotEmpty(VolumeError):
    """The target is a directory with something in it: a bind would hide it (gRPC
    FAILED_PRECONDITION)."""


class ForeignMount(VolumeError):
    """The target holds a mount that is not one of the plugin's: it is left alone (gRPC
    FAILED_PRECONDITION)."""


class SpokeUnavailable(VolumeError):
    """The spoke's mount is not there or cannot answer now; retry later (gRPC UNAVAILABLE)."""


class TooManyVolumes(VolumeError):
    """The pod, or the node, holds as many of this plugin's volumes as it may (gRPC
    RESOURCE_EXHAUSTED)."""


class Misconfigured(VolumeError):
    """The plugin's own settings keep it from deciding, e.g. the hub refuses its TLS (gRPC
    FAILED_PRECONDITION: retrying does not help until an operator fixes them)."""


class Volumes:
    """Publishes snapshot versions from the spoke's mount at target paths.

    Args:
        mount: The spoke's FUSE mount as this process sees it (``MOUNT/DATASET/VERSION``).
        state_dir: Where publications are recorded (survives restarts of the plugin).
        targets: Where targets may be (:mod:`csi.targets`: below the kubelet's pods
            directory, reached without following symlinks).
    """

    def __init__(self, mount: Path, state_dir: Path, targets: Targets) -> None:
        self.mount = resolve_target(str(mount))
        self.state = StateDir(state_dir, targets.root)
        self.targets = targets
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    @contextlib.contextmanager
    def _locked(self, target: Path) -> Iterator[None]:
        with self._guard:
            lock = self._locks.setdefault(str(target), threading.Lock())
        with lock:
            yield

    def spoke_mount(self) -> Mount:
        """The spoke mount's line of the mount table.

        Raises:
            SpokeUnavailable: nothing of type ``fuse.strata`` is mounted at the mount path.
        """
        here = mounted_at(self.mount)
        if here is None or here.fstype != MOUNT_FSTYPE:
            raise SpokeUnavailable(
                f"the spoke's mount {self.mount} is not mounted (is the spoke running?)"
            )
        return here

    def ready(self) -> bool:
        """True when the spoke's mount is up."""
        try:
            self.spoke_mount()
        except SpokeUnavailable:
            return False
        return True

    def resolve(self, dataset: str, ref: str) -> str:
        """The version ``ref`` names in ``dataset`` now, as the spoke's mount shows it.

        Raises:
            NoSuchSnapshot: no such dataset, or no such version or tag in it.
            SpokeUnavailable: the mount is down or cannot answer (hub unreachable with
                nothing cached, the daemon restarting).
        """
        self.spoke_mount()
        where = self.mount / dataset / ref
        try:
            mode = os.lstat(where).st_mode
            version = os.readlink(where) if stat.S_ISLNK(mode) else ref
        except FileNotFoundError:
            if not self._exists(self.mount / dataset):
                raise NoSuchSnapshot(f"dataset {dataset!r} does not exist") from None
            raise NoSuchSnapshot(f"dataset {dataset!r} has no version or tag {ref!r}") from None
        except OSError as err:
            raise SpokeUnavailable(
                f"the spoke cannot answer for {dataset}@{ref} now: {err.strerror}"
            ) from err
        if (not stat.S_ISLNK(mode) and not stat.S_ISDIR(mode)) or "/" in version:
            raise SpokeUnavailable(f"the spoke's mount shows {where} as no version")
        return version

    def _exists(self, path: Path) -> bool:
        try:
            os.lstat(path)
        except FileNotFoundError:
            return False
        except OSError as err:
            raise SpokeUnavailable(f"the spoke cannot answer now: {err.strerror}") from err
        return True

    def publish(
        self, volume_id: str, target_path: str, dataset: str, ref: str, for_pod: str = ""
    ) -> Publication:
        """Bind ``dataset``'s version named by ``ref`` read-only at ``target_path``;
        ``for_pod`` (``namespace/name``, from the kubelet) goes into the log line.

        Returns:
            The publication (the one already there when this exact volume is published).

        Raises:
            InvalidVolume: the target is not one the kubelet may give (:mod:`csi.targets`).
            TargetTaken: the target holds another volume (another volume id included),
                version or file system.
            TargetNotEmpty: the target is a directory with something in it.
            NoSuchSnapshot, SpokeUnavailable: as :meth:`resolve`.
            VolumeError: mount(2) refused (its errno in the message).
        """
        target = self._target(target_path)
        with self._locked(target):
            record = self.state.get(str(target))
            same = record is not None and (record.volume_id, record.dataset, record.ref) == (
                volume_id,
                dataset,
                ref,
            )
            here = mounted_at(target)
            if here is not None:
                return self._already(here, record, same, volume_id, target, dataset, ref)
            namespace = for_pod.partition("/")[0] if "/" in for_pod else ""
            if record is None:
                self._room(target, namespace)
            version = record.version if same and record is not None else self.resolve(dataset, ref)
            publication = Publication(volume_id, str(target), dataset, ref, version, namespace)
            self._bind(publication)
            self.state.put(publication)
            log.info(
                "published %s@%s (%s) at %s%s",
                dataset,
                ref,
                version,
                target,
                f" for pod {for_pod}" if for_pod else "",
            )
            return publication

    def _already(
        self,
        here: Mount,
        record: Publication | None,
        same: bool,
        volume_id: str,
        target: Path,
        dataset: str,
        ref: str,
    ) -> Publication:
        """The answer for a target that is a mountpoint already: this volume (``same``: its
        record names this volume id, dataset and ref), or taken. A record of another volume
        id is a conflict (CSI spec, NodePublishVolume: ALREADY_EXISTS) and stays as it is."""
        spoke = self.spoke_mount()
        ours = here.device == spoke.device
        if record is not None:
            if same and ours and here.root == f"/{dataset}/{record.version}":
                return record
            held = f"{here.root.lstrip('/')} of the spoke" if ours else f"a {here.fstype} mount"
            raise TargetTaken(
                f"{target} already holds {held} (volume {record.volume_id}); unpublish it first"
            )
        if ours and here.root.startswith(f"/{dataset}/"):
            # published before the record was kept: it is this volume if the ref agrees
            version = self.resolve(dataset, ref)
            if here.root == f"/{dataset}/{version}":
                publication = Publication(volume_id, str(target), dataset, ref, version)
                self.state.put(publication)
                return publication
        held = f"{here.root.lstrip('/')} of the spoke" if ours else f"a {here.fstype} mount"
        raise TargetTaken(f"{target} already holds {held}; unpublish it first")

    def _room(self, target: Path, namespace: str) -> None:
        """Refuses a new target past :data:`MAX_POD_VOLUMES` for its pod,
        :data:`MAX_NAMESPACE_VOLUMES` for its pod's ``namespace`` (when the kubelet gave
        one) or :data:`MAX_NODE_VOLUMES` on the node.

        Raises:
            TooManyVolumes: no room.
        """
        pod = self.state.pod_of(str(target))
        if self.state.held(pod) >= MAX_POD_VOLUMES:
            raise TooManyVolumes(
                f"pod {pod} holds {MAX_POD_VOLUMES} Strata volumes, the most one pod may"
            )
        if namespace and self.state.in_namespace(namespace) >= MAX_NAMESPACE_VOLUMES:
            raise TooManyVolumes(
                f"the pods of namespace {namespace} hold {MAX_NAMESPACE_VOLUMES} Strata "
                "volumes on this node, the most one namespace may"
            )
        if len(self.state) >= MAX_NODE_VOLUMES:
            raise TooManyVolumes(
                f"this node holds {MAX_NODE_VOLUMES} Strata volumes, the most it may"
            )

    def _target(self, target_path: str) -> Path:
        try:
            return self.targets.canonical(target_path)
        except TargetRefused as err:
            raise InvalidVolume(str(err)) from None

    def _bind(self, publication: Publication) -> None:
        """Bind the publication's version at its target, through descriptors: the target's
        parent reached without symlinks, the target made there (or found empty) and bound by
        its own descriptor, then made read-only through the bind's root; checked in the
        mount table after, so a component swapped meanwhile leaves nothing mounted
        elsewhere. A name that vanishes meanwhile is the version's only when the version's
        directory is gone from the spoke's mount; otherwise the target changed."""
        target = Path(publication.target)
        source = self.mount / publication.dataset / publication.version
        what = f"{publication.dataset} {publication.version}"
        try:
            with self.targets.parent(target) as parent:
                made = _make_dir(parent, target.name)
                try:
                    self._bind_at(parent, source, target)
                except BaseException:
                    if made:
                        with contextlib.suppress(OSError):
                            os.rmdir(target.name, dir_fd=parent)
                    raise
        except TargetRefused as err:
            raise InvalidVolume(str(err)) from None
        except FileNotFoundError as err:
            if not self._exists(source):
                raise NoSuchSnapshot(f"{what} is gone from the spoke (revoked?)") from err
            if not os.path.lexists(target.parent):
                raise InvalidVolume(
                    f"the target's parent {target.parent} does not exist (or moved during the call)"
                ) from err
            raise InvalidVolume(
                f"{target} changed while it was being published (a directory on its path "
                "vanished): nothing mounted"
            ) from err
        except OSError as err:
            if err.errno in (errno.ENOTCONN, errno.EIO):
                raise SpokeUnavailable(f"the spoke cannot show {what} now: {err.strerror}") from err
            raise VolumeError(f"cannot mount {what} at {target}: {err.strerror}") from err

    def _bind_at(self, parent: int, source: Path, target: Path) -> None:
        below = Targets.open_at(parent, target)  # the directory the bind goes on
        try:
            if os.listdir(fd_path(below)):
                raise TargetNotEmpty(
                    f"{target} is a directory with something in it, which a bind would hide: "
                    "refused"
                )
            bind(source, fd_path(below))
            try:
                top = Targets.open_at(parent, target)  # by name now: the bind's root
                try:
                    make_read_only(source, fd_path(top))
                finally:
                    os.close(top)
                here = mounted_at(target)
                spoke = self.spoke_mount()
                if (
                    here is None
                    or here.device != spoke.device
                    or here.root != f"/{source.parent.name}/{source.name}"
                ):
                    raise InvalidVolume(f"{target} changed while it was being published")
            except BaseException:
                detach(fd_path(below))  # the bind on that directory, wherever it went
                raise
        finally:
            os.close(below)

    def unpublish(self, volume_id: str, target_path: str) -> None:
        """Unmount the bind this plugin made at ``target_path`` and remove the target;
        nothing to do when it is not there.

        Only a bind the plugin recorded is unmounted, and only while the mount table shows
        it as that record's version of the spoke's mount: never the spoke's own mount, a
        bind someone else made, or a mount stacked on one.

        Raises:
            InvalidVolume: the target is not one the kubelet may give, or holds another
                volume than ``volume_id``.
            ForeignMount: the target holds a mount that is not this plugin's recorded bind.
            VolumeError: umount2(2) or rmdir(2) refused (``EBUSY``, ``ENOTEMPTY`` …).
        """
        target = self._target(target_path)
        with self._locked(target):
            record = self.state.get(str(target))
            if record is not None and record.volume_id != volume_id:
                raise InvalidVolume(f"{target} holds volume {record.volume_id}, not {volume_id}")
            here = mounted_at(target)
            if here is not None and not _is_bind_of(here, record):
                held = "no bind of this plugin" if record is None else "another mount"
                raise ForeignMount(f"{target} holds a {here.fstype} mount ({held}): left alone")
            try:
                with self.targets.parent(target) as parent:
                    if here is not None:
                        unmount(fd_path(parent, target.name))
                    with contextlib.suppress(FileNotFoundError):
                        os.rmdir(target.name, dir_fd=parent)
            except TargetRefused as err:
                raise InvalidVolume(str(err)) from None
            except FileNotFoundError as err:
                if here is not None:  # a bind is there, by its path: a component was swapped
                    raise InvalidVolume(
                        f"{target} changed while it was being unpublished: left as it is"
                    ) from err
                # its parent is gone already: nothing was there
            except OSError as err:
                raise VolumeError(f"cannot unpublish {target}: {err.strerror}") from err
            self.state.drop(str(target))
            if record is not None or here is not None:
                log.info("unpublished %s from %s", volume_id, target)


def _is_bind_of(here: Mount, record: Publication | None) -> bool:
    """Whether the mount at a target is the bind ``record`` says the plugin made there: of
    the spoke's mount's type, rooted at the recorded version (read from the mount table,
    so a dead spoke mount cannot hang the check)."""
    return (
        record is not None
        and here.fstype == MOUNT_FSTYPE
        and here.root == f"/{record.dataset}/{record.version}"
    )


def _make_dir(parent: int, name: str) -> bool:
    """Make directory ``name`` in ``parent`` (0750, as the kubelet makes targets); whether
    it was made here."""
    try:
        os.mkdir(name, 0o750, dir_fd=parent)
    except FileExistsError:
        return False
    return True
