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

The data commands (``prepare``, ``synth``, ``plan``) are :mod:`trainer.datacli`'s, the
options and error handling every command shares :mod:`trainer.cliopts`'s. Input errors
print one line, ``strata-train: error: ...``, on stderr and exit with status 2. Heavy
imports (torch, mdio) happen inside the commands, so ``--help`` stays fast. Both the
console script and ``python -m trainer`` guard their entry with ``if __name__ ==
"__main__"``, which MDIO's and the DataLoader's ``spawn`` worker processes require.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from trainer.cliopts import DATA_HELP, StorageOptionFlag, fail, storage_options
from trainer.datacli import plan, prepare, synth
from trainer.hints import HintTarget
from trainer.location import data_path
from trainer.presets import PRESETS

app = typer.Typer(
    name="strata-train",
    help="Seismic 3D ViT masked autoencoder: data preparation, training and evaluation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


# the data commands (trainer.datacli) keep their place in --help: before fit, and plan last
app.command()(prepare)
app.command()(synth)


@app.command()
def fit(
    data: Annotated[str, typer.Option("--data", help=DATA_HELP)],
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
        storage_options=storage_options(storage_option),
    )
    try:
        run_fit(options, echo=typer.echo)
    except (DataError, FitError) as exc:
        fail(str(exc))


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
        fail(f"--hints-token-file: {exc}")
    except ValueError as exc:
        fail(f"--hints-stream: {exc}")


@app.command("eval")
def eval_(
    ckpt: Annotated[Path, typer.Option("--ckpt", help="Checkpoint written by fit.")],
    data: Annotated[str, typer.Option("--data", help=DATA_HELP)],
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
        storage_options=storage_options(storage_option),
    )
    from trainer.volume import DataError

    try:
        evaluate(options, echo=typer.echo)
    except (DataError, EvalError) as exc:
        fail(str(exc))


@app.command()
def load(
    data: Annotated[str, typer.Option("--data", help=DATA_HELP)],
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
        storage_options=storage_options(storage_option),
        client=client,
    )
    try:
        summary = run_load(options, echo=typer.echo)
    except (DataError, FitError) as exc:
        fail(str(exc))
    if json_out is not None:
        write_json(json_out, summary)


app.command()(plan)


def main() -> None:
    """Console-script entry point of ``strata-train``."""
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("strata-train: interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
