"""``strata-train``: prepare seismic volumes and train the masked autoencoder.

Commands:

* ``strata-train prepare --segy FILE --out OUT.mdio`` converts post-stack 3D
  SEG-Y to MDIO v1 (:mod:`trainer.prepare`).
* ``strata-train fit --data PATH.mdio`` trains on random patches read with Zarr
  from any directory path (:mod:`trainer.train`).

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

from trainer.presets import PRESETS

EXIT_USAGE = 2

app = typer.Typer(
    name="strata-train",
    help="Seismic 3D ViT masked autoencoder: SEG-Y to MDIO preparation and training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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
def fit(
    data: Annotated[Path, typer.Option("--data", help="Zarr/MDIO store to train on (read-only).")],
    steps: Annotated[int, typer.Option("--steps", help="Optimiser steps.")] = 300,
    preset: Annotated[
        str, typer.Option("--preset", help=f"Model preset: {', '.join(PRESETS)}.")
    ] = "tiny",
    out: Annotated[
        Path, typer.Option("--out", help="Output directory (must not be inside --data).")
    ] = Path("strata-train-out"),
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", help="Patches per step [preset default].")
    ] = None,
    workers: Annotated[int, typer.Option("--workers", help="DataLoader worker processes.")] = 2,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    log_every: Annotated[
        int, typer.Option("--log-every", help="Write a metrics line every K steps.")
    ] = 1,
    epoch_size: Annotated[
        int, typer.Option("--epoch-size", help="Patch positions per epoch.")
    ] = 1024,
    lr: Annotated[
        float | None, typer.Option("--lr", help="Peak learning rate [preset default].")
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option("--threads", help="Torch threads [cores minus workers, at least half]."),
    ] = None,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
) -> None:
    """Train the 3D ViT masked autoencoder on random patches of a seismic volume."""
    from trainer.train import DataError, FitError, FitOptions
    from trainer.train import fit as run_fit

    options = FitOptions(
        data=data,
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
    )
    try:
        run_fit(options, echo=typer.echo)
    except (DataError, FitError) as exc:
        _fail(str(exc))


def main() -> None:
    """Console-script entry point of ``strata-train``."""
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("strata-train: interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
