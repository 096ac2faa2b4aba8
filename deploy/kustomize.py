"""Render deploy/k8s overlays without kubectl: the subset of kustomize they use.

    python -m deploy.kustomize deploy/k8s/overlays/gpu-region > gpu-region.yaml

``kubectl kustomize`` is the reference; this renderer exists so that ``make test`` can
render and validate the manifests on a machine without kubectl, and a test checks that
both give the same objects where kubectl is present. It understands exactly the fields
Strata's kustomizations use (https://kubectl.docs.kubernetes.io/references/kustomize/
kustomization/) and refuses any other with :class:`KustomizeError`, so it can never
silently render something different:

* ``resources``: YAML files (one or more documents) and directories holding a
  ``kustomization.yaml``, rendered first, in order;
* ``namespace``: set on every namespaced object;
* ``labels``: ``pairs`` added to each object's ``metadata.labels`` (neither selectors
  nor templates: ``includeSelectors``/``includeTemplates`` false);
* ``images``: ``newName``/``newTag``/``digest`` for containers whose image name matches;
* ``secretGenerator``: ``files`` (``key=path`` or ``path``), ``envs`` and ``literals``,
  with ``generatorOptions.disableNameSuffixHash: true`` (the hash suffix is not done);
* ``patches``: strategic merge patches, each naming its object by ``kind`` and
  ``metadata.name`` (no ``target``): maps merge (``null`` deletes a key); the lists of a
  pod template merge element by element on their Kubernetes merge key (containers,
  initContainers, env and volumes by ``name``, volumeMounts by ``mountPath``; patch
  elements first, in their order, then the object's others, as kustomize orders them;
  ``$patch: delete`` removes one); ``args``, ``command`` and a NetworkPolicy's
  ``ingress``/``egress`` are replaced whole, as are every list of a custom resource
  (ServiceMonitor, PrometheusRule). RFC 6902 JSON patches, which address list elements
  by index, are refused: a patch names what it changes.
"""

from __future__ import annotations

import base64
import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

KNOWN_FIELDS = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "labels",
    "images",
    "secretGenerator",
    "generatorOptions",
    "patches",
}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CSIDriver",
    "CustomResourceDefinition",
    "PersistentVolume",
    "PriorityClass",
    "StorageClass",
}


class KustomizeError(ValueError):
    """A kustomization this renderer cannot render (the message says what and where)."""


def _load_yaml(path: Path) -> list[Obj]:
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except (OSError, yaml.YAMLError) as exc:
        raise KustomizeError(f"{path}: {exc}") from exc
    return [doc for doc in docs if doc is not None]


def _read(base: Path, name: str) -> bytes:
    path = base / name
    try:
        return path.read_bytes()
    except OSError as exc:
        raise KustomizeError(f"{path}: {exc.strerror}") from exc


def _secret(base: Path, spec: Obj) -> Obj:
    data: dict[str, str] = {}
    for entry in spec.get("files", []):
        key, _, name = entry.rpartition("=")
        data[key or Path(name).name] = base64.b64encode(_read(base, name)).decode()
    for env in spec.get("envs", []):
        for line in _read(base, env).decode().splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise KustomizeError(f"{base / env}: {line!r} is not KEY=VALUE")
            data[key] = base64.b64encode(value.encode()).decode()
    for literal in spec.get("literals", []):
        key, _, value = literal.partition("=")
        data[key] = base64.b64encode(value.encode()).decode()
    unknown = set(spec) - {"name", "files", "envs", "literals", "type"}
    if unknown:
        raise KustomizeError(f"{base}: secretGenerator fields not supported: {sorted(unknown)}")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": spec["name"]},
        "type": spec.get("type", "Opaque"),
        "data": dict(sorted(data.items())),
    }


MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
}
"""Lists merged element by element, by the key Kubernetes' schema gives them."""
ATOMIC_LISTS = {"args", "command", "ingress", "egress"}
"""Lists Kubernetes' schema has no merge key for: a patch replaces them whole."""
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}
"""Custom resources: kustomize knows no schema for them, so their lists are atomic."""


def _merge(obj: Obj, patch: Obj, custom: bool, where: str) -> None:
    """Applies a strategic merge ``patch`` to the mapping ``obj`` in place."""
    for key, value in patch.items():
        here = f"{where}.{key}"
        if key.startswith("$"):
            raise KustomizeError(f"patch directive {here} not supported")
        if value is None:
            obj.pop(key, None)
        elif isinstance(value, dict):
            current = obj.get(key)
            if not isinstance(current, dict):
                current = obj[key] = {}
            _merge(current, value, custom, here)
        elif isinstance(value, list) and not custom and key in MERGE_KEYS:
            obj[key] = _merge_list(obj.get(key) or [], value, MERGE_KEYS[key], custom, here)
        elif isinstance(value, list) and not custom and key not in ATOMIC_LISTS:
            raise KustomizeError(f"patch of the list {here}: its merge rule is not known here")
        else:
            obj[key] = copy.deepcopy(value)


def _merge_list(
    current: list[Obj], patch: list[Obj], key: str, custom: bool, where: str
) -> list[Obj]:
    """A list merged on ``key``: the patch's elements first (merged into the object's
    element of the same key, if any), then the object's others, in their order."""
    by_key = {item.get(key): item for item in current if isinstance(item, dict)}
    merged: list[Obj] = []
    for element in patch:
        if not isinstance(element, dict) or key not in element:
            raise KustomizeError(f"{where}: every element names its {key}")
        directive = element.get("$patch")
        if directive == "delete":
            by_key.pop(element[key], None)
            continue
        if directive is not None:
            raise KustomizeError(f"{where}: $patch: {directive} not supported")
        target = copy.deepcopy(by_key.pop(element[key], {}))
        _merge(target, element, custom, f"{where}[{element[key]}]")
        merged.append(target)
    return merged + [item for item in current if item.get(key) in by_key]


def _strategic_merge(objects: list[Obj], patch: Any, path: Path) -> None:
    """Applies one entry of ``patches`` to the object it names."""
    if set(patch) != {"patch"}:
        raise KustomizeError(
            f"{path}: a patch is one strategic merge patch naming its object, no "
            f"target, path or options: {sorted(patch)}"
        )
    body = yaml.safe_load(patch["patch"])
    if not isinstance(body, dict) or not {"kind", "metadata"} <= set(body):
        raise KustomizeError(
            f"{path}: only strategic merge patches (an object with kind and metadata.name) "
            "are supported; JSON patches address list elements by index"
        )
    kind, name = body["kind"], body["metadata"].get("name")
    matched = [o for o in objects if o.get("kind") == kind and o["metadata"]["name"] == name]
    if len(matched) != 1:
        raise KustomizeError(f"{path}: patch of {kind} {name} matches {len(matched)} objects")
    (obj,) = matched
    if obj.get("apiVersion") != body.get("apiVersion"):
        raise KustomizeError(f"{path}: patch of {kind} {name}: apiVersion differs")
    _merge(obj, body, kind in CUSTOM_KINDS, f"{kind}/{name}")


def _containers(node: Any) -> Iterator[Obj]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict))
            else:
                yield from _containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _containers(item)


def _set_images(obj: Obj, images: list[Obj]) -> None:
    for container in _containers(obj):
        image = container.get("image", "")
        name = image.split("@")[0]
        if ":" in name.rpartition("/")[2]:
            name = name.rpartition(":")[0]
        for rule in images:
            if rule["name"] != name:
                continue
            new = rule.get("newName", name)
            if "digest" in rule:
                container["image"] = f"{new}@{rule['digest']}"
            elif "newTag" in rule:
                container["image"] = f"{new}:{rule['newTag']}"
            else:
                container["image"] = image.replace(name, new, 1)


def render(directory: Path) -> list[Obj]:
    """The objects ``kubectl kustomize DIRECTORY`` would print (see the module docstring).

    Raises:
        KustomizeError: a field or form this renderer does not support, a missing file,
            or a patch that does not apply.
    """
    path = directory / "kustomization.yaml"
    docs = _load_yaml(path)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise KustomizeError(f"{path}: expected one mapping")
    spec: Obj = docs[0]
    unknown = set(spec) - KNOWN_FIELDS
    if unknown:
        raise KustomizeError(f"{path}: fields not supported: {sorted(unknown)}")
    objects: list[Obj] = []
    for entry in spec.get("resources", []):
        target = directory / entry
        objects.extend(render(target) if target.is_dir() else _load_yaml(target))
    if spec.get("secretGenerator"):
        if not spec.get("generatorOptions", {}).get("disableNameSuffixHash"):
            raise KustomizeError(f"{path}: name suffix hashes not supported")
        objects.extend(_secret(directory, s) for s in spec["secretGenerator"])
    objects = copy.deepcopy(objects)
    for patch in spec.get("patches", []):
        _strategic_merge(objects, patch, path)
    for obj in objects:
        meta = obj.setdefault("metadata", {})
        if "namespace" in spec and obj.get("kind") not in CLUSTER_SCOPED:
            meta["namespace"] = spec["namespace"]
        for label in spec.get("labels", []):
            if label.get("includeSelectors") or label.get("includeTemplates"):
                raise KustomizeError(f"{path}: labels on selectors/templates not supported")
            meta.setdefault("labels", {}).update(label["pairs"])
        _set_images(obj, spec.get("images", []))
    return objects


def main(argv: list[str] | None = None) -> int:
    """``python -m deploy.kustomize DIR``: print the rendered objects as YAML documents."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m deploy.kustomize DIR", file=sys.stderr)
        return 2
    try:
        objects = render(Path(args[0]))
    except KustomizeError as exc:
        print(f"deploy.kustomize: error: {exc}", file=sys.stderr)
        return 2
    yaml.safe_dump_all(objects, sys.stdout, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
