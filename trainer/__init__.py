"""Strata's seismic trainer: MDIO/Zarr patch dataset, 3D ViT-MAE model, training loop, data prep.

The trainer imports nothing of the rest of Strata: it reads a path (a local
directory or a Strata FUSE mount) or an object-store URL with Zarr, like any other
program would.

Modules: :mod:`trainer.presets` (model sizes), :mod:`trainer.prepare` (SEG-Y to
MDIO), :mod:`trainer.synth` (synthetic volumes: writing them; what is asked in
:mod:`trainer.synthspec`, the earth model in :mod:`trainer.earthmodel`),
:mod:`trainer.location` (``--data`` paths and URLs, storage options), :mod:`trainer.volume`
(inspection, trace mask), :mod:`trainer.stats` (normalisation), :mod:`trainer.plan`
(seeds, sampler, epoch plan), :mod:`trainer.readorder` (chunk keys for hints),
:mod:`trainer.dataset` (the patch dataset), :mod:`trainer.dataloader` (the dataset,
plan and DataLoader ``fit`` and ``load`` share), :mod:`trainer.loadonly` (the loader-only
mode; its counted and in-memory patch sources in :mod:`trainer.loadsources`),
:mod:`trainer.model` (MAE),
:mod:`trainer.train` (the :class:`~trainer.train.Trainer` and its loop),
:mod:`trainer.options` (what a run is asked), :mod:`trainer.schedule` (AdamW, warm-up +
cosine), :mod:`trainer.checkpoint` (save, load, RNG state, resumability),
:mod:`trainer.distributed` (ranks, devices, threads,
autocast, collectives), :mod:`trainer.report`
(metrics, summary),
:mod:`trainer.evaluate` (PSNR and section plots; the model run on masked patches in
:mod:`trainer.reconstruct`, the plot in :mod:`trainer.section`), :mod:`trainer.cli`
(``strata-train``; its data commands in :mod:`trainer.datacli`, its options declared once
in :mod:`trainer.settings` and made typer options by :mod:`trainer.cliopts`),
:mod:`trainer.command` (its ``fit`` command line, for programs that run the trainer).
"""
