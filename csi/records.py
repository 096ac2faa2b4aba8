"""What the plugin has published, kept across its restarts: one JSON record per target in
the state directory, and, in memory, how many targets each pod holds (the caps of
:class:`csi.volumes.Volumes` are checked against them).

A pod is named by the first component of its target below the kubelet's pods directory
(``PODS/<pod uid>/volumes/kubernetes.io~csi/<volume>/mount``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from strata_local.atomic import write_atomic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Publication:
    """A volume published at a target.

    Attributes:
        volume_id: The CO's id of the volume.
        target: The target path, absolute with its parent's symlinks resolved.
        dataset: The dataset name.
        ref: The version or tag the volume asked for.
        version: The version ``ref`` resolved to when first published (``v3``).
    """

    volume_id: str
    target: str
    dataset: str
    ref: str
    version: str


class StateDir:
    """One JSON file per published target, named by the SHA-256 of its path (0600, written
    by rename so a crash leaves the old record or the new one, never half of one), and the
    targets each pod holds.

    Args:
        root: The state directory (made 0700 if missing).
        pods: The kubelet's pods directory as targets are written (the pod of a target is
            its first component below it).
    """

    def __init__(self, root: Path, pods: Path = Path("/")) -> None:
        self.root, self._pods = root, pods
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._by_pod: dict[str, set[str]] = {}
        for path in root.glob("*.json"):
            try:
                self._count(json.loads(path.read_text())["target"])
            except (OSError, ValueError, KeyError, TypeError) as err:
                log.warning("state record %s not read: %s", path.name, err)

    def pod_of(self, target: str) -> str:
        """The pod uid a target belongs to ("" when it is not below the pods directory)."""
        try:
            parts = Path(target).relative_to(self._pods).parts
        except ValueError:
            return ""
        return parts[0] if parts else ""

    def held(self, pod: str) -> int:
        """How many targets ``pod`` holds."""
        return len(self._by_pod.get(pod, ()))

    def __len__(self) -> int:
        """How many targets are recorded."""
        return sum(len(targets) for targets in self._by_pod.values())

    def _path(self, target: str) -> Path:
        return self.root / (hashlib.sha256(target.encode()).hexdigest()[:32] + ".json")

    def _count(self, target: str) -> None:
        self._by_pod.setdefault(self.pod_of(target), set()).add(target)

    def get(self, target: str) -> Publication | None:
        """The record of ``target``, or None."""
        try:
            data = json.loads(self._path(target).read_text())
        except FileNotFoundError:
            return None
        return Publication(**data)

    def put(self, publication: Publication) -> None:
        """Record ``publication`` (replacing any record of its target)."""
        path = self._path(publication.target)
        write_atomic(path, json.dumps(asdict(publication)).encode())
        self._count(publication.target)

    def drop(self, target: str) -> None:
        """Forget ``target`` (nothing happens when it has no record)."""
        self._path(target).unlink(missing_ok=True)
        pod = self.pod_of(target)
        held = self._by_pod.get(pod)
        if held is not None:
            held.discard(target)
            if not held:
                del self._by_pod[pod]
