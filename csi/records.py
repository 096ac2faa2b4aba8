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
        namespace: The pod's namespace, as the kubelet gave it ("" in a record an older
            plugin wrote, or where the kubelet gives none).
    """

    volume_id: str
    target: str
    dataset: str
    ref: str
    version: str
    namespace: str = ""


class StateDir:
    """One JSON file per published target, named by the SHA-256 of its path (0600, written
    by rename so a crash leaves the old record or the new one, never half of one), and the
    targets each pod and each namespace holds.

    Args:
        root: The state directory (made 0700 if missing).
        pods: The kubelet's pods directory as targets are written (the pod of a target is
            its first component below it).
    """

    def __init__(self, root: Path, pods: Path = Path("/")) -> None:
        self.root, self._pods = root, pods
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._where: dict[str, tuple[str, str]] = {}  # target -> (pod, namespace)
        self._by_pod: dict[str, set[str]] = {}
        self._by_namespace: dict[str, set[str]] = {}
        for path in root.glob("*.json"):
            try:
                record = json.loads(path.read_text())
                self._count(record["target"], str(record.get("namespace", "")))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
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

    def in_namespace(self, namespace: str) -> int:
        """How many targets pods of ``namespace`` hold."""
        return len(self._by_namespace.get(namespace, ()))

    def __len__(self) -> int:
        """How many targets are recorded."""
        return len(self._where)

    def _path(self, target: str) -> Path:
        return self.root / (hashlib.sha256(target.encode()).hexdigest()[:32] + ".json")

    def _count(self, target: str, namespace: str) -> None:
        self._forget(target)
        pod = self.pod_of(target)
        self._where[target] = (pod, namespace)
        self._by_pod.setdefault(pod, set()).add(target)
        self._by_namespace.setdefault(namespace, set()).add(target)

    def _forget(self, target: str) -> None:
        where = self._where.pop(target, None)
        if where is None:
            return
        for index, key in ((self._by_pod, where[0]), (self._by_namespace, where[1])):
            held = index.get(key)
            if held is not None:
                held.discard(target)
                if not held:
                    del index[key]

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
        self._count(publication.target, publication.namespace)

    def drop(self, target: str) -> None:
        """Forget ``target`` (nothing happens when it has no record)."""
        self._path(target).unlink(missing_ok=True)
        self._forget(target)
