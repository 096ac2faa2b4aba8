"""The two patch sources of the loader-only mode (:mod:`trainer.loadonly`), shaped alike:
:class:`CountedPatchDataset` reads the Zarr store through a :class:`CountingStore`, so
each item carries the stored chunk bytes its read fetched, and :class:`MemoryPatchDataset`
reads one copy of the volume held in shared memory (the loader's own ceiling).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
import zarr
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import WrapperStore

from trainer.dataset import PatchDataset
from trainer.objstore import raw_store
from trainer.presets import Shape3
from trainer.stats import VolumeStats
from trainer.volume import MASK_CACHE_TRACES, BoolArray, VolumeInfo, open_store

_METADATA = frozenset({"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"})


class CountingStore(WrapperStore[Store]):
    """A read-only Zarr store that counts the bytes it returns for the chunks under ``prefix``.

    Metadata documents are not counted: only the chunk (or shard) objects a read fetches.

    Args:
        store: The store read (``LocalStore`` or ``FsspecStore``).
        prefix: Keys counted (e.g. ``"amplitude/"``: the amplitude's chunks).
    """

    def __init__(self, store: Store, prefix: str = "") -> None:
        super().__init__(store)
        self.prefix = prefix
        self.bytes_read = 0

    def _with_store(self, store: Store) -> CountingStore:
        twin = CountingStore(store, self.prefix)
        twin.bytes_read = self.bytes_read
        return twin

    def _counted(self, key: str) -> bool:
        return key.startswith(self.prefix) and key.rpartition("/")[2] not in _METADATA

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        """The inner store's ``get``, counted."""
        buf = await self._store.get(key, prototype, byte_range)
        if buf is not None and self._counted(key):
            self.bytes_read += len(buf)
        return buf

    async def get_partial_values(
        self,
        prototype: BufferPrototype,
        key_ranges: Iterable[tuple[str, ByteRequest | None]],
    ) -> list[Buffer | None]:
        """The inner store's ``get_partial_values``, counted."""
        ranges = list(key_ranges)
        bufs = await self._store.get_partial_values(prototype, ranges)
        for (key, _), buf in zip(ranges, bufs, strict=True):
            if buf is not None and self._counted(key):
                self.bytes_read += len(buf)
        return bufs


class CountedPatchDataset(PatchDataset):
    """The patch dataset read through a :class:`CountingStore`.

    ``dataset[corner]`` is ``(patch, corner, store_bytes)``: the
    :class:`~trainer.dataset.PatchDataset` item and an int64 scalar tensor, the
    amplitude bytes the store returned for this read.
    """

    def __init__(
        self, info: VolumeInfo, patch: Shape3, stats: VolumeStats, client: str = "fsspec"
    ) -> None:
        super().__init__(info, patch, stats)
        self.client = client  # how a URL is read: fsspec or obstore (trainer.objstore)
        self._store: CountingStore | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the open store (workers reopen it)."""
        state = super().__getstate__()
        state["_store"] = None
        return state

    def _open(self) -> tuple[zarr.Array[Any], zarr.Array[Any] | BoolArray | None]:
        if self._amplitude is None:
            store = CountingStore(
                raw_store(self.info.path, self.info.storage_options, self.client),
                f"{self.info.variable}/",
            )
            group = zarr.open_group(store=store, mode="r")
            amp = group[self.info.variable]
            assert isinstance(amp, zarr.Array)
            if self.info.mask_variable is not None:
                mask = group[self.info.mask_variable]
                assert isinstance(mask, zarr.Array)
                small = self.info.shape[0] * self.info.shape[1] <= MASK_CACHE_TRACES
                self._mask = np.asarray(mask[...], dtype=np.bool_) if small else mask
            self._amplitude = amp
            self._store = store
        return self._amplitude, self._mask

    def __getitem__(self, corner: Sequence[int]) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        """Return ``(patch (1, I, X, T) float32, corner (3,) int64, store bytes () int64)``."""
        self._open()
        assert self._store is not None
        before = self._store.bytes_read
        patch, where = super().__getitem__(corner)
        return patch, where, torch.tensor(self._store.bytes_read - before, dtype=torch.int64)


def _shared(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` moved to shared memory: spawned workers map it instead of copying it."""
    tensor.share_memory_()  # type: ignore[no-untyped-call]
    return tensor


class MemoryPatchDataset(PatchDataset):
    """The patch dataset read from one in-memory copy of the volume, shared with the workers.

    The amplitudes (and the live mask) are read whole in the constructor into
    shared-memory tensors, which the workers map instead of copying; each item is sliced,
    normalised and masked by :meth:`PatchDataset.read_patch` exactly as from the store.
    Items are ``(patch, corner, 0)``, shaped as :class:`CountedPatchDataset`'s.

    Args:
        info: The volume.
        patch: Patch shape.
        stats: Normalisation statistics.
    """

    def __init__(self, info: VolumeInfo, patch: Shape3, stats: VolumeStats) -> None:
        super().__init__(info, patch, stats)
        group = open_store(info.path, info.storage_options)
        amp = group[info.variable]
        assert isinstance(amp, zarr.Array)
        self.volume = _shared(torch.from_numpy(np.ascontiguousarray(amp[...])))
        self.live: torch.Tensor | None = None
        if info.mask_variable is not None:
            mask = group[info.mask_variable]
            assert isinstance(mask, zarr.Array)
            live = np.ascontiguousarray(mask[...], dtype=np.bool_)
            self.live = _shared(torch.from_numpy(live))

    @property
    def nbytes(self) -> int:
        """Bytes held in memory (amplitudes and mask)."""
        mask = 0 if self.live is None else int(self.live.numel())
        return int(self.volume.numel() * self.volume.element_size()) + mask

    def _open(self) -> tuple[Any, BoolArray | None]:
        live = None if self.live is None else self.live.numpy()
        return self.volume.numpy(), live

    def __getitem__(self, corner: Sequence[int]) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        """Return ``(patch (1, I, X, T) float32, corner (3,) int64, 0 () int64)``."""
        patch, where = super().__getitem__(corner)
        return patch, where, torch.tensor(0, dtype=torch.int64)
