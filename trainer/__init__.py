"""Strata's seismic trainer: MDIO/Zarr patch dataset, 3D ViT-MAE model, training loop, data prep.

The trainer imports nothing of the rest of Strata: it reads a path (a local
directory or a Strata FUSE mount) with Zarr, like any other program would.

Modules: :mod:`trainer.presets` (model sizes), :mod:`trainer.prepare` (SEG-Y to
MDIO), :mod:`trainer.synth` (synthetic volumes), :mod:`trainer.dataset`
(patches, epoch plans, planned read order), :mod:`trainer.model` (MAE),
:mod:`trainer.train` (loop, checkpoints, DDP, measurements),
:mod:`trainer.evaluate` (PSNR and section plots), :mod:`trainer.cli`
(``strata-train``), :mod:`trainer.command` (its ``fit`` command line, for programs that
run the trainer).
"""
