"""SEG-Y to MDIO v1 conversion for training (``strata-train prepare``).

The conversion itself is multidimio 1.1.3's ``mdio.segy_to_mdio`` with its
``PostStack3DTime`` (or ``PostStack3DDepth``) template: a Zarr v3 group whose
amplitudes are the float32 variable :data:`AMPLITUDE_VARIABLE` with dimensions
``(inline, crossline, time)`` and whose live/dead trace flags are the boolean
variable :data:`TRACE_MASK_VARIABLE` with dimensions ``(inline, crossline)``.
Dead traces hold NaN amplitudes.

Before handing a file to MDIO the headers are checked with the ``segy`` package
so that files the trainer cannot use are rejected with a one-line reason
(:class:`PrepareError`) instead of a deep stack trace: 2D lines or wrong header
bytes (a single inline or crossline value), duplicate traces, and traces too
short for a training patch.

MDIO's ingest runs worker processes with the ``spawn`` start method, so callers
must run this from a module guarded by ``if __name__ == "__main__"`` (the
``strata-train`` console script and ``python -m trainer`` both are).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer.presets import min_trace_samples

AMPLITUDE_VARIABLE = "amplitude"
"""Name MDIO's post-stack templates give the amplitude variable."""

TRACE_MASK_VARIABLE = "trace_mask"
"""Name of MDIO's boolean live-trace mask, dimensions ``(inline, crossline)``."""

CHUNK_SHAPE = (64, 64, 64)
"""Amplitude chunk shape (inline, crossline, samples): 1 MiB of float32, the size
TGS recommends for 3D access and comfortably inside one Strata block."""

MDIO_SPARSITY_LIMIT = 10.0
"""MDIO refuses grids with more than this many grid cells per trace."""

_HEADER_SCAN_BLOCK = 100_000


class PrepareError(Exception):
    """A SEG-Y file cannot be turned into a training volume; the message is one line."""


@dataclass(frozen=True)
class SegyGeometry:
    """What the trace headers say about a post-stack SEG-Y file.

    Attributes:
        num_traces: Number of traces in the file.
        samples_per_trace: Samples in each trace.
        sample_format: The ``segy`` package's name of the sample format
            (e.g. ``"int16"``, ``"ibm32"``, ``"float32"``).
        inlines: Sorted distinct inline numbers.
        crosslines: Sorted distinct crossline numbers.
        unique_positions: Number of distinct (inline, crossline) pairs.
    """

    num_traces: int
    samples_per_trace: int
    sample_format: str
    inlines: np.ndarray[Any, np.dtype[np.int64]]
    crosslines: np.ndarray[Any, np.dtype[np.int64]]
    unique_positions: int

    @property
    def shape(self) -> tuple[int, int, int]:
        """Grid shape (inlines, crosslines, samples) MDIO will build."""
        return (len(self.inlines), len(self.crosslines), self.samples_per_trace)


@dataclass(frozen=True)
class PrepareResult:
    """Outcome of a successful conversion.

    Attributes:
        out: Path of the MDIO store written.
        shape: Shape of the amplitude variable (inline, crossline, time).
        live_traces: Number of live traces (the SEG-Y trace count).
        inline_range: First and last inline number.
        crossline_range: First and last crossline number.
        sample_format: Sample format of the input file.
        variable: Name of the amplitude variable.
        trace_mask: Name of the live-trace mask variable.
        elapsed_s: Wall time of the whole conversion, in seconds.
    """

    out: Path
    shape: tuple[int, int, int]
    live_traces: int
    inline_range: tuple[int, int]
    crossline_range: tuple[int, int]
    sample_format: str
    variable: str
    trace_mask: str
    elapsed_s: float


def segy_spec(inline_byte: int, crossline_byte: int) -> Any:
    """Build a SEG-Y rev1 spec with the index headers at the given bytes.

    Args:
        inline_byte: 1-based byte of the int32 inline number in the trace header.
        crossline_byte: 1-based byte of the int32 crossline number.

    Returns:
        A ``segy.schema.SegySpec`` that also carries the fields MDIO's post-stack
        template needs (``cdp_x``, ``cdp_y``, ``coordinate_scalar``).
    """
    from segy.schema import HeaderField, ScalarType
    from segy.standards import get_segy_standard

    fields = [
        HeaderField(name="inline", byte=inline_byte, format=ScalarType.INT32),
        HeaderField(name="crossline", byte=crossline_byte, format=ScalarType.INT32),
        HeaderField(name="cdp_x", byte=181, format=ScalarType.INT32),
        HeaderField(name="cdp_y", byte=185, format=ScalarType.INT32),
        HeaderField(name="coordinate_scalar", byte=71, format=ScalarType.INT16),
    ]
    return get_segy_standard(1.0).customize(trace_header_fields=fields)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= 300 else line[:297] + "..."


def _check_header_byte(name: str, byte: int) -> None:
    if not 1 <= byte <= 237:
        raise PrepareError(f"--{name}-byte {byte} is outside the 240-byte trace header")


def scan_geometry(segy: Path, inline_byte: int = 189, crossline_byte: int = 193) -> SegyGeometry:
    """Read the index headers of a SEG-Y file.

    Headers are read in blocks, so memory stays bounded for large files.

    Args:
        segy: Path of the SEG-Y file.
        inline_byte: 1-based byte of the int32 inline number in the trace header.
        crossline_byte: 1-based byte of the int32 crossline number.

    Returns:
        The file's geometry as the headers describe it.

    Raises:
        PrepareError: If the file is missing or cannot be parsed as SEG-Y.
    """
    _check_header_byte("inline", inline_byte)
    _check_header_byte("crossline", crossline_byte)
    if not segy.exists():
        raise PrepareError(f"SEG-Y file not found: {segy}")
    if not segy.is_file():
        raise PrepareError(f"not a file: {segy}")
    if segy.stat().st_size < 3600 + 240:
        raise PrepareError(f"{segy} is too small to be a SEG-Y file (no trace after the headers)")

    from segy import SegyFile

    try:
        f = SegyFile(str(segy), spec=segy_spec(inline_byte, crossline_byte))
        num_traces = int(f.num_traces)
        samples = int(f.samples_per_trace)
        fmt = str(getattr(f.spec.trace.data.format, "value", f.spec.trace.data.format))
        il_parts: list[np.ndarray[Any, np.dtype[np.int64]]] = []
        xl_parts: list[np.ndarray[Any, np.dtype[np.int64]]] = []
        pair_parts: list[np.ndarray[Any, np.dtype[np.int64]]] = []
        for start in range(0, num_traces, _HEADER_SCAN_BLOCK):
            h = f.header[start : min(start + _HEADER_SCAN_BLOCK, num_traces)]
            il = np.asarray(h["inline"], dtype=np.int64)
            xl = np.asarray(h["crossline"], dtype=np.int64)
            il_parts.append(np.unique(il))
            xl_parts.append(np.unique(xl))
            pair_parts.append(np.unique((il << 32) ^ (xl & 0xFFFFFFFF)))
    except Exception as exc:  # the segy package raises many types on malformed input
        raise PrepareError(f"cannot read {segy} as SEG-Y: {_first_line(exc)}") from exc
    if num_traces <= 0:
        raise PrepareError(f"{segy} holds no traces")
    inlines = np.unique(np.concatenate(il_parts))
    crosslines = np.unique(np.concatenate(xl_parts))
    pairs = np.unique(np.concatenate(pair_parts)).size
    return SegyGeometry(num_traces, samples, fmt, inlines, crosslines, int(pairs))


def check_geometry(
    geometry: SegyGeometry, inline_byte: int = 189, crossline_byte: int = 193
) -> None:
    """Reject geometries the trainer cannot use.

    Args:
        geometry: Result of :func:`scan_geometry`.
        inline_byte: Inline header byte used (for the message).
        crossline_byte: Crossline header byte used (for the message).

    Raises:
        PrepareError: If the traces are shorter than the smallest training patch,
            there is no 3D grid (one inline or one crossline value), traces share
            grid positions, or the grid is too sparse for MDIO.
    """
    g = geometry
    need = min_trace_samples()
    if g.samples_per_trace < need:
        raise PrepareError(
            f"traces have {g.samples_per_trace} samples; a training patch needs at least {need}"
        )
    n_il, n_xl = len(g.inlines), len(g.crosslines)
    if n_il < 2 or n_xl < 2:
        parts = []
        for label, byte, values in (
            ("inline", inline_byte, g.inlines),
            ("crossline", crossline_byte, g.crosslines),
        ):
            if len(values) == 1:
                parts.append(f"{label} header (byte {byte}) is {int(values[0])} on every trace")
            else:
                parts.append(f"{len(values)} distinct {label}s (byte {byte})")
        raise PrepareError(
            f"no 3D geometry: {' and '.join(parts)} across {g.num_traces} traces "
            "(2D data, or set --inline-byte/--crossline-byte)"
        )
    if g.unique_positions < g.num_traces:
        raise PrepareError(
            f"{g.num_traces} traces share {g.unique_positions} (inline, crossline) positions: "
            "duplicate traces or wrong --inline-byte/--crossline-byte"
        )
    cells = n_il * n_xl
    if cells > MDIO_SPARSITY_LIMIT * g.num_traces:
        raise PrepareError(
            f"grid of {n_il} inlines x {n_xl} crosslines holds only {g.num_traces} traces "
            f"(more than {MDIO_SPARSITY_LIMIT:g}x sparse): wrong header bytes?"
        )


@contextlib.contextmanager
def quiet_progress(enabled: bool) -> Iterator[None]:
    """Turn MDIO's tqdm progress bars off unless ``enabled``.

    tqdm reads ``TQDM_*`` variables when it is first imported, so this must wrap
    the first import of ``mdio``.
    """
    key = "TQDM_DISABLE"
    old = os.environ.get(key)
    if not enabled:
        os.environ[key] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def _convert(
    segy: Path, tmp_out: Path, inline_byte: int, crossline_byte: int, domain: str, progress: bool
) -> None:
    with quiet_progress(progress):
        from mdio import segy_to_mdio
        from mdio.builder.template_registry import get_template

    template = get_template(f"PostStack3D{domain.capitalize()}")
    template.full_chunk_shape = CHUNK_SHAPE
    segy_to_mdio(
        segy_spec=segy_spec(inline_byte, crossline_byte),
        mdio_template=template,
        input_path=str(segy),
        output_path=str(tmp_out),
        overwrite=True,
    )


def prepare(
    segy: Path,
    out: Path,
    *,
    inline_byte: int = 189,
    crossline_byte: int = 193,
    domain: str = "time",
    overwrite: bool = False,
    progress: bool = False,
) -> PrepareResult:
    """Convert a post-stack 3D SEG-Y file to an MDIO v1 store for training.

    The store is written next to ``out`` under a temporary name and renamed into
    place when complete, so ``out`` never holds a half-written volume.

    Args:
        segy: Input SEG-Y file (rev0/rev1/rev2; IBM, IEEE or integer samples).
        out: Output directory, conventionally ``NAME.mdio``.
        inline_byte: 1-based byte of the int32 inline number (SEG-Y rev1: 189).
        crossline_byte: 1-based byte of the int32 crossline number (rev1: 193).
        domain: Vertical domain, ``"time"`` or ``"depth"``; picks the MDIO template
            ``PostStack3DTime`` or ``PostStack3DDepth`` and the name of the last
            dimension.
        overwrite: Replace ``out`` if it exists.
        progress: Show MDIO's progress bars on stderr.

    Returns:
        What was written.

    Raises:
        PrepareError: On any input the trainer cannot use (missing file, not
            SEG-Y, no 3D geometry, duplicate traces, traces too short, output
            exists) or if MDIO's conversion fails; the message is one line.
    """
    t0 = time.perf_counter()
    if domain not in ("time", "depth"):
        raise PrepareError(f"--domain must be 'time' or 'depth', not {domain!r}")
    segy = Path(segy)
    out = Path(out)
    geometry = scan_geometry(segy, inline_byte, crossline_byte)
    check_geometry(geometry, inline_byte, crossline_byte)

    if out.exists() and not overwrite:
        raise PrepareError(f"output exists: {out} (use --overwrite to replace it)")
    if out.exists() and not out.is_dir():
        raise PrepareError(f"output exists and is not a directory: {out}")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise PrepareError(f"output directory does not exist: {parent}")

    tmp_out = parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp_out, ignore_errors=True)
    try:
        _convert(segy, tmp_out, inline_byte, crossline_byte, domain, progress)
        if out.exists():
            shutil.rmtree(out)
        tmp_out.rename(out)
    except PrepareError:
        raise
    except Exception as exc:  # MDIO and the segy package raise many types on bad input
        raise PrepareError(f"MDIO conversion of {segy} failed: {_first_line(exc)}") from exc
    finally:
        shutil.rmtree(tmp_out, ignore_errors=True)

    return PrepareResult(
        out=out,
        shape=geometry.shape,
        live_traces=geometry.num_traces,
        inline_range=(int(geometry.inlines[0]), int(geometry.inlines[-1])),
        crossline_range=(int(geometry.crosslines[0]), int(geometry.crosslines[-1])),
        sample_format=geometry.sample_format,
        variable=AMPLITUDE_VARIABLE,
        trace_mask=TRACE_MASK_VARIABLE,
        elapsed_s=time.perf_counter() - t0,
    )
