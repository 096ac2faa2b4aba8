"""Helpers for the hub's unit tests."""

from __future__ import annotations

from collections.abc import Iterable

from hub.catalog import Catalog, Snapshot
from hub.snapshot.manifest import ManifestEntry
from hub.snapshot.names import validate_dataset, validate_tag


def add_version(
    catalog: Catalog,
    dataset: str,
    block_size: int,
    entries: Iterable[ManifestEntry],
    *,
    tag: str | None = "latest",
    created_ns: int | None = None,
    version: str | None = None,
) -> Snapshot:
    """Records a new version of a dataset from a whole manifest (all or nothing).

    The blocks must already be stored. A convenience over
    :class:`hub.catalog.PublishSession` for tests (publishing itself streams the tree:
    :mod:`hub.publish.tree`).

    Args:
        catalog: The catalog to publish into.
        dataset: The dataset's name.
        block_size: The snapshot's maximum block length, bytes.
        entries: The manifest, in path order.
        tag: A tag to point at the new version, or None.
        created_ns: Publish time, nanoseconds since the Unix epoch; default now.
        version: Publish as exactly this version (must be the next one); default the
            next one.

    Returns:
        The new version's snapshot.

    Raises:
        InvalidName: ``dataset``, ``tag``, ``version`` or a path is malformed.
        InvalidArgument: ``block_size`` is out of range, or ``version`` is not next.
        VersionExists: ``version`` is already published.
        ValueError: ``entries`` are out of path order or repeat a path.
        CatalogError: The catalog is full or cannot be written.
    """
    validate_dataset(dataset)
    if tag is not None:
        validate_tag(tag)
    session = catalog.begin_publish(block_size)
    try:
        for entry in entries:
            session.add(entry)
        return session.commit(dataset, tag=tag, created_ns=created_ns, version=version)
    finally:
        session.abort()
