"""The ``strata-train`` commands that prepare and inspect data: ``prepare`` (SEG-Y to
MDIO), ``synth`` (a synthetic volume) and ``plan`` (the store keys an epoch reads), as
plain functions that :mod:`trainer.cli` registers on its app.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from trainer.cliopts import fail, settings, storage_options, with_settings
from trainer.location import data_path
from trainer.settings import PlanSettings


def prepare(
    segy: Annotated[Path, typer.Option("--segy", help="Input post-stack 3D SEG-Y file.")],
    out: Annotated[Path, typer.Option("--out", help="Output MDIO store (directory).")],
    inline_byte: Annotated[
        int, typer.Option("--inline-byte", help="Trace-header byte of the int32 inline number.")
    ] = 189,
    crossline_byte: Annotated[
        int,
        typer.Option("--crossline-byte", help="Trace-header byte of the int32 crossline number."),
    ] = 193,
    domain: Annotated[
        str, typer.Option("--domain", help="Vertical domain of the samples: time or depth.")
    ] = "time",
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace OUT if it exists.")
    ] = False,
    progress: Annotated[
        bool, typer.Option("--progress", help="Show MDIO's progress bars on stderr.")
    ] = False,
) -> None:
    """Convert a post-stack 3D SEG-Y file to MDIO v1 (Zarr v3) for training."""
    from trainer.prepare import PrepareError
    from trainer.prepare import prepare as run_prepare

    try:
        result = run_prepare(
            segy,
            out,
            inline_byte=inline_byte,
            crossline_byte=crossline_byte,
            domain=domain,
            overwrite=overwrite,
            progress=progress,
        )
    except PrepareError as exc:
        fail(str(exc))
    shape = "x".join(map(str, result.shape))
    typer.echo(
        f"wrote {result.out}: {result.variable} {shape} (inline x crossline x {domain}), "
        f"{result.live_traces} live traces, inlines {result.inline_range[0]}-"
        f"{result.inline_range[1]}, crosslines {result.crossline_range[0]}-"
        f"{result.crossline_range[1]}, trace mask '{result.trace_mask}', "
        f"{result.elapsed_s:.1f} s"
    )


def synth(
    shape: Annotated[
        str, typer.Option("--shape", help="Volume size IxXxT: inlines x crosslines x samples.")
    ],
    out: Annotated[Path, typer.Option("--out", help="Output MDIO store (directory).")],
    chunks: Annotated[
        str, typer.Option("--chunks", help="Amplitude chunk shape IxXxT.")
    ] = "64x64x64",
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    noise: Annotated[
        float, typer.Option("--noise", help="Noise rms relative to the reflectivity rms.")
    ] = 0.1,
    faults: Annotated[int, typer.Option("--faults", help="Number of normal faults.")] = 3,
    peak_hz: Annotated[
        float, typer.Option("--peak-hz", help="Ricker wavelet peak frequency, Hz.")
    ] = 25.0,
    dt_ms: Annotated[int, typer.Option("--dt-ms", help="Sample interval, ms.")] = 4,
    dead_fraction: Annotated[
        float, typer.Option("--dead-fraction", help="Fraction of dead traces (NaN, masked).")
    ] = 0.0,
    workers: Annotated[
        int, typer.Option("--workers", help="Processes computing chunk columns.")
    ] = 1,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace OUT if it exists.")
    ] = False,
    progress: Annotated[
        bool, typer.Option("--progress", help="Report progress on stderr.")
    ] = False,
) -> None:
    """Write a synthetic seismic volume (folded, faulted layers; Ricker wavelet; noise) as MDIO."""
    from trainer.synth import synth as run_synth
    from trainer.synthspec import SynthError, SynthSpec, parse_shape

    def report(done: int, total: int) -> None:
        if done == total or done % max(1, total // 20) == 0:
            typer.echo(f"  {done}/{total} chunk columns", err=True)

    try:
        spec = SynthSpec(
            shape=parse_shape(shape),
            chunks=parse_shape(chunks, "--chunks"),
            seed=seed,
            noise=noise,
            faults=faults,
            peak_frequency_hz=peak_hz,
            sample_interval_ms=dt_ms,
            dead_fraction=dead_fraction,
        )
        result = run_synth(
            out, spec, overwrite=overwrite, workers=workers, progress=report if progress else None
        )
    except SynthError as exc:
        fail(str(exc))
    typer.echo(
        f"wrote {result.out}: amplitude {'x'.join(map(str, result.shape))} "
        f"(inline x crossline x time), chunks {'x'.join(map(str, result.chunks))}, "
        f"{result.nbytes / 2**20:.1f} MiB ({result.stored_bytes / 2**20:.1f} MiB stored), "
        f"{result.live_traces} live traces, {result.elapsed_s:.1f} s "
        f"({result.mib_per_s:.1f} MiB/s)"
    )


@with_settings(PlanSettings)
def plan(**given: Any) -> None:
    """Print the store keys a fit run reads in one epoch, in order (prefetch hints)."""
    s = settings(PlanSettings, given)
    from trainer.plan import build_plan
    from trainer.presets import get_preset
    from trainer.readorder import epoch_read_order
    from trainer.volume import DataError, inspect_volume

    try:
        config = get_preset(s.preset)
        info = inspect_volume(data_path(s.data), storage_options(s.storage_option))
        the_plan = build_plan(
            info,
            config.input_size,
            epoch_size=s.epoch_size,
            batch_size=config.batch_size if s.batch_size is None else s.batch_size,
            seed=s.seed,
            world_size=s.world_size,
            min_live_fraction=s.min_live,
            chunk_aligned=s.chunk_aligned,
        )
        keys = epoch_read_order(the_plan, info, s.epoch, s.rank, unique=not s.all_reads)
    except (DataError, ValueError) as exc:
        fail(str(exc))
    typer.echo("\n".join(keys))
