"""``strata-train``: prepare seismic volumes and train the masked autoencoder.

Commands:

* ``strata-train prepare --segy FILE --out OUT.mdio`` converts post-stack 3D
  SEG-Y to MDIO v1 (:mod:`trainer.prepare`).
* ``strata-train synth --shape IxXxT --out OUT.mdio`` writes a synthetic volume
  of any size as MDIO (:mod:`trainer.synth`).
* ``strata-train fit --data PATH.mdio`` trains on random patches read with Zarr
  from a directory path or an object-store URL, alone or under ``torchrun``
  (:mod:`trainer.train`).
* ``strata-train eval --ckpt RUN/checkpoint.pt --data PATH.mdio`` measures
  reconstruction PSNR and draws an inline section (:mod:`trainer.evaluate`).
* ``strata-train load --data PATH.mdio`` drains fit's DataLoader with no model (or a
  fixed emulated compute time per batch) from the store or from memory and reports
  samples/s, MB/s and the data-wait share (:mod:`trainer.loadonly`).
* ``strata-train plan --data PATH.mdio`` prints the store keys an epoch reads,
  in order (:func:`trainer.readorder.epoch_read_order`).

Input errors print one line, ``strata-train: error: ...``, on stderr and exit
with status 2. Heavy imports (torch, mdio) happen inside the commands, so
``--help`` stays fast. Both the console script and ``python -m trainer`` guard
their entry with ``if __name__ == "__main__"``, which MDIO's and the
DataLoader's ``spawn`` worker processes require.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from trainer.hints import HintTarget
from trainer.location import data_path, parse_storage_options
from trainer.presets import PRESETS

EXIT_USAGE = 2

app = typer.Typer(
    name="strata-train",
    help="Seismic 3D ViT masked autoencoder: data preparation, training and evaluation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


_DATA_HELP = (
    "Zarr/MDIO store (read-only): a directory, or a URL such as s3://bucket/f3.mdio "
    "read through fsspec (endpoint and credentials from the environment, e.g. "
    "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, or --storage-option)."
)

StorageOptionFlag = Annotated[
    list[str] | None,
    typer.Option(
        "--storage-option",
        help="KEY=VALUE passed to the URL's fsspec filesystem (repeatable; JSON values "
        "such as true or 16 are parsed; ignored for a local path).",
    ),
]


def _storage_options(items: list[str] | None) -> dict[str, object]:
    try:
        return parse_storage_options(items or [])
    except ValueError as exc:
        _fail(str(exc))


def _fail(message: str) -> NoReturn:
    """Print a one-line error on stderr and exit with status 2."""
    line = " ".join(message.split())
    typer.echo(f"strata-train: error: {line}", err=True)
    raise typer.Exit(EXIT_USAGE)


@app.command()
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
        _fail(str(exc))
    shape = "x".join(map(str, result.shape))
    typer.echo(
        f"wrote {result.out}: {result.variable} {shape} (inline x crossline x {domain}), "
        f"{result.live_traces} live traces, inlines {result.inline_range[0]}-"
        f"{result.inline_range[1]}, crosslines {result.crossline_range[0]}-"
        f"{result.crossline_range[1]}, trace mask '{result.trace_mask}', "
        f"{result.elapsed_s:.1f} s"
    )


@app.command()
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
        _fail(str(exc))
    typer.echo(
        f"wrote {result.out}: amplitude {'x'.join(map(str, result.shape))} "
        f"(inline x crossline x time), chunks {'x'.join(map(str, result.chunks))}, "
        f"{result.nbytes / 2**20:.1f} MiB ({result.stored_bytes / 2**20:.1f} MiB stored), "
        f"{result.live_traces} live traces, {result.elapsed_s:.1f} s "
        f"({result.mib_per_s:.1f} MiB/s)"
    )


@app.command()
def fit(
    data: Annotated[str, typer.Option("--data", help=_DATA_HELP)],
    steps: Annotated[
        int, typer.Option("--steps", help="Total optimiser steps (the schedule's length).")
    ] = 300,
    preset: Annotated[
        str, typer.Option("--preset", help=f"Model preset: {', '.join(PRESETS)}.")
    ] = "tiny",
    out: Annotated[
        Path, typer.Option("--out", help="Output directory (must not be inside --data).")
    ] = Path("strata-train-out"),
    batch_size: Annotated[
        int | None,
        typer.Option("--batch-size", help="Patches per step and rank (default: the preset's)."),
    ] = None,
    workers: Annotated[
        int, typer.Option("--workers", help="DataLoader worker processes per rank.")
    ] = 2,
    mp_context: Annotated[
        str, typer.Option("--mp-context", help="Worker start method: spawn or forkserver.")
    ] = "spawn",
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    log_every: Annotated[
        int, typer.Option("--log-every", help="Write a metrics line every K steps.")
    ] = 1,
    epoch_size: Annotated[
        int, typer.Option("--epoch-size", help="Patch positions per epoch (all ranks).")
    ] = 1024,
    lr: Annotated[
        float | None, typer.Option("--lr", help="Peak learning rate (default: the preset's).")
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option("--threads", help="Torch threads (default: cores minus workers, >= half)."),
    ] = None,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    amp: Annotated[
        bool | None,
        typer.Option("--amp/--no-amp", help="bf16 autocast (default: on exactly when on CUDA)."),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue exactly from OUT/checkpoint.pt.")
    ] = False,
    checkpoint_every: Annotated[
        int, typer.Option("--checkpoint-every", help="Steps between checkpoints (0: end only).")
    ] = 100,
    stop_at: Annotated[
        int | None,
        typer.Option("--stop-at", help="Stop after this step with a checkpoint (resume later)."),
    ] = None,
    chunk_aligned: Annotated[
        bool,
        typer.Option("--chunk-aligned", help="Place patches to read as few chunks as possible."),
    ] = False,
    min_live: Annotated[
        float, typer.Option("--min-live", help="Reject patches with fewer live traces.")
    ] = 0.5,
    clip: Annotated[
        float, typer.Option("--clip", help="Clip normalised amplitudes at this many sigma.")
    ] = 3.0,
    scale: Annotated[
        float, typer.Option("--scale", help="Multiply clipped z-scores by this.")
    ] = 1.0,
    clip_grad: Annotated[
        float, typer.Option("--clip-grad", help="Gradient-norm limit (0: off).")
    ] = 1.0,
    hints: Annotated[
        str | None,
        typer.Option("--hints", help="Post each epoch's read order to URL/v1/hints (opt-in)."),
    ] = None,
    hints_dataset: Annotated[
        str | None, typer.Option("--hints-dataset", help="Default: the data path's grandparent.")
    ] = None,
    hints_ref: Annotated[
        str | None, typer.Option("--hints-ref", help="Default: the data path's parent.")
    ] = None,
    hints_prefix: Annotated[
        str | None, typer.Option("--hints-prefix", help="Store path in the snapshot (its name).")
    ] = None,
    hints_token_file: Annotated[
        Path | None, typer.Option("--hints-token-file", help="Bearer token for --hints.")
    ] = None,
    hints_stream: Annotated[
        str | None,
        typer.Option(
            "--hints-stream",
            help="Base name of the run's hint streams (rank N posts as NAME.rankN). "
            "Default: fit- and a hash of --out.",
        ),
    ] = None,
    storage_option: StorageOptionFlag = None,
) -> None:
    """Train the 3D ViT masked autoencoder on random patches of a seismic volume.

    Under torchrun (e.g. ``torchrun --nproc-per-node 2 -m trainer fit ...``) each
    rank reads its own shard of every epoch and gradients are averaged with DDP.
    """
    from trainer.options import FitError, FitOptions
    from trainer.train import fit as run_fit
    from trainer.volume import DataError

    options = FitOptions(
        data=data_path(data),
        out=out,
        steps=steps,
        preset=preset,
        batch_size=batch_size,
        workers=workers,
        seed=seed,
        log_every=log_every,
        epoch_size=epoch_size,
        lr=lr,
        threads=threads,
        device=device,
        mp_context=mp_context,
        checkpoint_every=checkpoint_every,
        resume=resume,
        stop_at=stop_at,
        chunk_aligned=chunk_aligned,
        min_live_fraction=min_live,
        clip=clip,
        scale=scale,
        clip_grad=clip_grad,
        amp=amp,
        hints=_hint_target(
            hints, data, hints_dataset, hints_ref, hints_prefix, hints_token_file, hints_stream
        ),
        storage_options=_storage_options(storage_option),
    )
    try:
        run_fit(options, echo=typer.echo)
    except (DataError, FitError) as exc:
        _fail(str(exc))


def _hint_target(
    url: str | None,
    data: str,
    dataset: str | None,
    ref: str | None,
    prefix: str | None,
    token_file: Path | None,
    stream: str | None = None,
) -> HintTarget | None:
    if url is None:
        return None
    try:
        return HintTarget.for_path(url, data_path(data), dataset, ref, prefix, token_file, stream)
    except OSError as exc:
        _fail(f"--hints-token-file: {exc}")
    except ValueError as exc:
        _fail(f"--hints-stream: {exc}")


@app.command("eval")
def eval_(
    ckpt: Annotated[Path, typer.Option("--ckpt", help="Checkpoint written by fit.")],
    data: Annotated[str, typer.Option("--data", help=_DATA_HELP)],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Output directory (default: the checkpoint's)."),
    ] = None,
    patches: Annotated[int, typer.Option("--patches", help="Held-out patches for PSNR.")] = 256,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Patches per pass.")] = 32,
    seed: Annotated[int, typer.Option("--seed", help="Seed of positions and masks.")] = 0,
    mask_ratio: Annotated[
        float | None, typer.Option("--mask-ratio", help="Hidden fraction (default: the model's).")
    ] = None,
    inline: Annotated[
        int | None,
        typer.Option("--inline", help="Inline index of the section (default: middle)."),
    ] = None,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    storage_option: StorageOptionFlag = None,
) -> None:
    """Reconstruction PSNR on held-out patches and a PNG of one inline section."""
    from trainer.evaluate import EvalError, EvalOptions, evaluate

    options = EvalOptions(
        ckpt=ckpt,
        data=data_path(data),
        out=out,
        patches=patches,
        batch_size=batch_size,
        seed=seed,
        mask_ratio=mask_ratio,
        inline=inline,
        device=device,
        storage_options=_storage_options(storage_option),
    )
    from trainer.volume import DataError

    try:
        evaluate(options, echo=typer.echo)
    except (DataError, EvalError) as exc:
        _fail(str(exc))


@app.command()
def load(
    data: Annotated[str, typer.Option("--data", help=_DATA_HELP)],
    source: Annotated[
        str,
        typer.Option(
            "--source",
            help="store: read the store; memory: the same volume from shared memory "
            "(the loader's own ceiling).",
        ),
    ] = "store",
    epochs: Annotated[int, typer.Option("--epochs", help="Whole epochs to read.")] = 1,
    compute_ms: Annotated[
        float,
        typer.Option("--compute-ms", help="Emulated compute time per batch, ms (0: none)."),
    ] = 0.0,
    preset: Annotated[
        str, typer.Option("--preset", help="Preset whose patch shape is read.")
    ] = "tiny",
    batch_size: Annotated[
        int | None,
        typer.Option("--batch-size", help="Patches per batch (default: the preset's)."),
    ] = None,
    workers: Annotated[int, typer.Option("--workers", help="DataLoader worker processes.")] = 2,
    mp_context: Annotated[
        str, typer.Option("--mp-context", help="Worker start method: spawn or forkserver.")
    ] = "spawn",
    seed: Annotated[int, typer.Option("--seed", help="Random seed (as fit's).")] = 0,
    epoch_size: Annotated[
        int, typer.Option("--epoch-size", help="Patch positions per epoch.")
    ] = 1024,
    chunk_aligned: Annotated[
        bool,
        typer.Option("--chunk-aligned", help="Place patches to read as few chunks as possible."),
    ] = False,
    min_live: Annotated[
        float, typer.Option("--min-live", help="Reject patches with fewer live traces.")
    ] = 0.5,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the summary to this file.")
    ] = None,
    storage_option: StorageOptionFlag = None,
    client: Annotated[
        str,
        typer.Option(
            "--client", help="How a URL --data is read: fsspec, or obstore (zarr's ObjectStore)."
        ),
    ] = "fsspec",
) -> None:
    """Loader only: fit's dataset, sampler, workers and collation, no model; reports
    samples/s, MB/s and the data-wait share per epoch."""
    from trainer.loadonly import LoadOptions, run_load
    from trainer.options import FitError
    from trainer.report import write_json
    from trainer.volume import DataError

    options = LoadOptions(
        data=data_path(data),
        preset=preset,
        batch_size=batch_size,
        workers=workers,
        mp_context=mp_context,
        epochs=epochs,
        epoch_size=epoch_size,
        seed=seed,
        chunk_aligned=chunk_aligned,
        min_live_fraction=min_live,
        compute_ms=compute_ms,
        source=source,
        storage_options=_storage_options(storage_option),
        client=client,
    )
    try:
        summary = run_load(options, echo=typer.echo)
    except (DataError, FitError) as exc:
        _fail(str(exc))
    if json_out is not None:
        write_json(json_out, summary)


@app.command()
def plan(
    data: Annotated[str, typer.Option("--data", help=_DATA_HELP)],
    epoch: Annotated[int, typer.Option("--epoch", help="Epoch (0-based).")] = 0,
    rank: Annotated[int, typer.Option("--rank", help="Rank whose shard to list.")] = 0,
    world_size: Annotated[int, typer.Option("--world-size", help="Number of ranks.")] = 1,
    preset: Annotated[str, typer.Option("--preset", help="Model preset.")] = "tiny",
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", help="Patches per step and rank.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    epoch_size: Annotated[int, typer.Option("--epoch-size", help="Positions per epoch.")] = 1024,
    chunk_aligned: Annotated[bool, typer.Option("--chunk-aligned")] = False,
    min_live: Annotated[float, typer.Option("--min-live")] = 0.5,
    all_reads: Annotated[
        bool, typer.Option("--all-reads", help="One line per chunk read, repeats included.")
    ] = False,
    storage_option: StorageOptionFlag = None,
) -> None:
    """Print the store keys a fit run reads in one epoch, in order (prefetch hints)."""
    from trainer.plan import build_plan
    from trainer.presets import get_preset
    from trainer.readorder import epoch_read_order
    from trainer.volume import DataError, inspect_volume

    try:
        config = get_preset(preset)
        info = inspect_volume(data_path(data), _storage_options(storage_option))
        the_plan = build_plan(
            info,
            config.input_size,
            epoch_size=epoch_size,
            batch_size=config.batch_size if batch_size is None else batch_size,
            seed=seed,
            world_size=world_size,
            min_live_fraction=min_live,
            chunk_aligned=chunk_aligned,
        )
        keys = epoch_read_order(the_plan, info, epoch, rank, unique=not all_reads)
    except (DataError, ValueError) as exc:
        _fail(str(exc))
    typer.echo("\n".join(keys))


def main() -> None:
    """Console-script entry point of ``strata-train``."""
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("strata-train: interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
