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

The data commands (``prepare``, ``synth``, ``plan``) are :mod:`trainer.datacli`'s. The
options of ``fit``, ``eval``, ``load`` and ``plan`` are declared once, in
:mod:`trainer.settings` (each also a ``STRATA_TRAIN_*`` variable; ``fit``'s also keys of a
TOML file, ``--config``), and made typer options by :mod:`trainer.cliopts`, with the error
handling every command shares. Input errors
print one line, ``strata-train: error: ...``, on stderr and exit with status 2. Heavy
imports (torch, mdio) happen inside the commands, so ``--help`` stays fast. Both the
console script and ``python -m trainer`` guard their entry with ``if __name__ ==
"__main__"``, which MDIO's and the DataLoader's ``spawn`` worker processes require.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from trainer.cliopts import config_option, fail, settings, storage_options, with_settings
from trainer.datacli import plan, prepare, synth
from trainer.hints import HintTarget
from trainer.location import data_path
from trainer.settings import EvalSettings, FitSettings, LoadSettings

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
@with_settings(FitSettings, config_option())
def fit(**given: Any) -> None:
    """Train the 3D ViT masked autoencoder on random patches of a seismic volume.

    Under torchrun (e.g. ``torchrun --nproc-per-node 2 -m trainer fit ...``) each
    rank reads its own shard of every epoch and gradients are averaged with DDP.
    """
    s = settings(FitSettings, given)  # a bad value fails before torch is imported
    from trainer.options import FitError, FitOptions
    from trainer.train import fit as run_fit
    from trainer.volume import DataError

    options = FitOptions(
        data=data_path(s.data),
        out=s.out,
        steps=s.steps,
        preset=s.preset,
        batch_size=s.batch_size,
        workers=s.workers,
        seed=s.seed,
        log_every=s.log_every,
        epoch_size=s.epoch_size,
        lr=s.lr,
        threads=s.threads,
        device=s.device,
        mp_context=s.mp_context,
        checkpoint_every=s.checkpoint_every,
        resume=s.resume,
        stop_at=s.stop_at,
        chunk_aligned=s.chunk_aligned,
        min_live_fraction=s.min_live,
        clip=s.clip,
        scale=s.scale,
        clip_grad=s.clip_grad,
        amp=s.amp,
        hints=_hint_target(s),
        storage_options=storage_options(s.storage_option),
    )
    try:
        run_fit(options, echo=typer.echo)
    except (DataError, FitError) as exc:
        fail(str(exc))


def _hint_target(s: FitSettings) -> HintTarget | None:
    if s.hints is None:
        return None
    try:
        return HintTarget.for_path(
            s.hints,
            data_path(s.data),
            s.hints_dataset,
            s.hints_ref,
            s.hints_prefix,
            s.hints_token_file,
            s.hints_stream,
        )
    except OSError as exc:
        fail(f"--hints-token-file: {exc}")
    except ValueError as exc:
        fail(f"--hints-stream: {exc}")


@app.command("eval")
@with_settings(EvalSettings)
def eval_(**given: Any) -> None:
    """Reconstruction PSNR on held-out patches and a PNG of one inline section."""
    s = settings(EvalSettings, given)
    from trainer.evaluate import EvalError, EvalOptions, evaluate
    from trainer.volume import DataError

    options = EvalOptions(
        ckpt=s.ckpt,
        data=data_path(s.data),
        out=s.out,
        patches=s.patches,
        batch_size=s.batch_size,
        seed=s.seed,
        mask_ratio=s.mask_ratio,
        inline=s.inline,
        device=s.device,
        storage_options=storage_options(s.storage_option),
    )
    try:
        evaluate(options, echo=typer.echo)
    except (DataError, EvalError) as exc:
        fail(str(exc))


@app.command()
@with_settings(LoadSettings)
def load(**given: Any) -> None:
    """Loader only: fit's dataset, sampler, workers and collation, no model; reports
    samples/s, MB/s and the data-wait share per epoch."""
    s = settings(LoadSettings, given)
    from trainer.loadonly import LoadOptions, run_load
    from trainer.options import FitError
    from trainer.report import write_json
    from trainer.volume import DataError

    options = LoadOptions(
        data=data_path(s.data),
        preset=s.preset,
        batch_size=s.batch_size,
        workers=s.workers,
        mp_context=s.mp_context,
        epochs=s.epochs,
        epoch_size=s.epoch_size,
        seed=s.seed,
        chunk_aligned=s.chunk_aligned,
        min_live_fraction=s.min_live,
        compute_ms=s.compute_ms,
        source=s.source,
        storage_options=storage_options(s.storage_option),
        client=s.client,
    )
    try:
        summary = run_load(options, echo=typer.echo)
    except (DataError, FitError) as exc:
        fail(str(exc))
    if s.json_out is not None:
        write_json(s.json_out, summary)


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
