"""The benchmark's data set: a synthetic MDIO volume of any size plus the real F3 volume.

Both are written once into a cache directory (``~/.cache/strata-bench`` unless told
otherwise) and reused by later runs, because generating the synthetic volume costs a few
minutes per GiB on a small machine:

* ``synth.mdio``: ``strata-train synth`` (folded, faulted layers convolved with a Ricker
  wavelet, plus noise), chunks 64³, then its amplitude array re-encoded **without
  compression**, so every chunk file is exactly 1 MiB (64³ float32). fio skips files
  smaller than its block size, and the blosc-zstd chunks ``synth`` writes are ~0.85 MiB,
  so with compression fio's 1 MiB jobs would read nothing. Its shape always has four
  inline chunks, so four fio jobs can each read one quarter (``amplitude/c/<k>/``).
* ``f3.mdio``: the F3 SEG-Y crop from ``../shared/data/seismic`` converted with
  ``strata-train prepare`` (skipped, and said so, when the SEG-Y file is missing).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHUNK = 64
"""Chunk edge of the synthetic volume, samples (64³ float32 = 1 MiB)."""

CHUNK_BYTES = CHUNK**3 * 4
"""Bytes of one uncompressed amplitude chunk."""

INLINE_CHUNKS = 4
"""Inline chunks of the synthetic volume: one per fio job."""

REPO_ROOT = Path(__file__).resolve().parent.parent


class DataError(RuntimeError):
    """The data set could not be made; the message says which step failed."""


@dataclass(frozen=True)
class Dataset:
    """The benchmark's source tree and what is in it.

    Attributes:
        root: Directory holding ``synth.mdio`` and (if available) ``f3.mdio``.
        synth: The synthetic volume's store.
        shape: Its shape (inline, crossline, time).
        f3: The F3 store, or ``None`` when the SEG-Y file was not found.
        files: Files in the tree.
        bytes: Bytes in the tree.
    """

    root: Path
    synth: Path
    shape: tuple[int, int, int]
    f3: Path | None
    files: int
    bytes: int

    @property
    def amplitude_chunks(self) -> Path:
        """``synth.mdio/amplitude/c``: one subdirectory per inline chunk (a fio job each)."""
        return self.synth / "amplitude" / "c"


def parse_size(text: str) -> int:
    """Bytes from ``2GiB``, ``512MiB``, ``1.5GiB``, ``64KiB``, ``10MB`` or a plain number.

    Raises:
        ValueError: The text is not a size.
    """
    units = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
    units |= {"kb": 1000, "mb": 10**6, "gb": 10**9}
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in units:
        raise ValueError(f"not a size: {text!r} (examples: 2GiB, 512MiB)")
    return int(float(match.group(1)) * units[match.group(2).lower()])


def volume_shape(size_bytes: int) -> tuple[int, int, int]:
    """A shape of about ``size_bytes`` of float32 with 4 inline chunks of 64.

    The time axis gets up to 16 chunks (1024 samples), the crossline axis the rest; the
    result is never smaller than 4 × 1 × 2 chunks (8 MiB).
    """
    chunks = max(8, round(size_bytes / CHUNK_BYTES))
    per_inline = max(2, chunks // INLINE_CHUNKS)
    t_chunks = min(16, max(2, 2 ** int(math.log2(per_inline) / 2 + 0.5)))
    x_chunks = max(1, round(per_inline / t_chunks))
    return INLINE_CHUNKS * CHUNK, x_chunks * CHUNK, t_chunks * CHUNK


def default_cache_dir() -> Path:
    """``$STRATA_BENCH_CACHE``, else ``$XDG_CACHE_HOME/strata-bench``, else ``~/.cache/…``."""
    env = os.environ.get("STRATA_BENCH_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "strata-bench"


def default_segy() -> Path:
    """``$STRATA_SEISMIC_DIR/f3.sgy``, else ``<repo>/../shared/data/seismic/f3.sgy``."""
    env = os.environ.get("STRATA_SEISMIC_DIR")
    base = Path(env) if env else REPO_ROOT.parent / "shared" / "data" / "seismic"
    return base / "f3.sgy"


def _trainer(step: str, *args: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise DataError(f"{step} failed (exit {proc.returncode}): {' / '.join(tail)}")


def decompress_amplitude(store: Path) -> None:
    """Rewrite ``store/amplitude`` with no compression codec, chunk by chunk.

    The array's shape, chunks, dtype, fill value, dimension names and attributes
    (MDIO's ``statsV1`` included) are kept; only the codec chain changes to plain
    little-endian ``bytes``.
    """
    import zarr

    path = store / "amplitude"
    src = zarr.open_array(str(path), mode="r")
    tmp = store / ".amplitude.raw"
    shutil.rmtree(tmp, ignore_errors=True)
    dst = zarr.create_array(
        str(tmp),
        shape=src.shape,
        chunks=src.chunks,
        dtype=src.dtype,
        fill_value=src.fill_value,
        compressors=None,
        attributes=dict(src.attrs),
        dimension_names=getattr(src.metadata, "dimension_names", None),
    )
    step = src.chunks[0]
    for i0 in range(0, src.shape[0], step):  # one inline chunk row at a time (bounded memory)
        dst[i0 : i0 + step] = src[i0 : i0 + step]
    old = store / ".amplitude.old"
    path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old)


def _tree_size(root: Path) -> tuple[int, int]:
    files = [p for p in root.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def ensure_dataset(
    cache_dir: Path,
    size_bytes: int,
    seed: int = 0,
    segy: Path | None = None,
    echo: Any = print,
) -> Dataset:
    """The data set for ``size_bytes``, made now if the cache does not hold it yet.

    Args:
        cache_dir: Where data sets are kept between runs.
        size_bytes: About how large the synthetic volume should be.
        seed: Seed of the synthetic volume.
        segy: The F3 SEG-Y file (default: :func:`default_segy`).
        echo: Progress messages go here.

    Returns:
        The data set; its ``root`` is the tree to publish, serve and read.

    Raises:
        DataError: Generating or converting failed.
    """
    shape = volume_shape(size_bytes)
    key = f"synth-{'x'.join(map(str, shape))}-seed{seed}-raw"
    root = cache_dir / key
    synth = root / "synth.mdio"
    done = cache_dir / f"{key}.complete.json"  # outside the tree: it is not data
    if not done.is_file():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        shape_text = "x".join(map(str, shape))
        echo(f"==> generating the synthetic volume {shape_text} (cached in {root})")
        workers = str(max(1, min(4, os.cpu_count() or 1)))
        _trainer(
            "strata-train synth",
            "synth",
            "--shape",
            shape_text,
            "--out",
            str(synth),
            "--seed",
            str(seed),
            "--workers",
            workers,
        )
        echo("==> storing its amplitude chunks uncompressed (1 MiB each)")
        decompress_amplitude(synth)
        done.write_text(json.dumps({"shape": shape, "seed": seed}) + "\n")
    f3 = root / "f3.mdio"
    segy = segy or default_segy()
    if not f3.is_dir() and segy.is_file():
        echo(f"==> converting {segy.name} (the real F3 volume) to MDIO")
        tmp = root / ".f3.partial.mdio"
        shutil.rmtree(tmp, ignore_errors=True)
        _trainer("strata-train prepare", "prepare", "--segy", str(segy), "--out", str(tmp))
        tmp.rename(f3)
    files, nbytes = _tree_size(root)
    return Dataset(
        root=root,
        synth=synth,
        shape=shape,
        f3=f3 if f3.is_dir() else None,
        files=files,
        bytes=nbytes,
    )
