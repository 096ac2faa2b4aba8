"""The one declaration of ``strata-train``'s options: ``fit``, ``load``, ``plan`` and ``eval``.

Each option is a pydantic field: its name is the TOML key, ``--NAME`` (or the field's
``json_schema_extra["flag"]``) its flag, ``STRATA_TRAIN_NAME`` its variable, and the
field's default and description its default and help; :func:`trainer.cliopts.with_settings`
makes a command's typer options of them. The options the commands share are declared once,
each on the settings of every command that takes it:

- :class:`VolumeSettings` (every command): ``--data``, ``--storage-option``;
- :class:`SamplingSettings` (``plan``, ``load``, ``fit``): what decides an epoch's patches,
  so ``plan`` prints exactly the reads of the ``fit`` or ``load`` run given the same flags
  or variables;
- :class:`LoaderSettings` (``load``, ``fit``): the DataLoader's workers.

Values come from the flags, then the ``STRATA_TRAIN_*`` variables, then (``fit`` only)
the TOML file of ``--config FILE`` or ``STRATA_TRAIN_CONFIG``; a value missing from all
three is the default, which for ``fit`` is :class:`~trainer.options.FitOptions`'s. This
module imports nothing heavy, so ``--help`` stays fast.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from trainer.options import FitOptions
from trainer.presets import PRESETS

ENV_PREFIX = "STRATA_TRAIN_"
CONFIG_ENV = "STRATA_TRAIN_CONFIG"
"""Variable naming ``fit``'s TOML file when ``--config`` is not given."""

DATA_HELP = (
    "Zarr/MDIO store (read-only): a directory, or a URL such as s3://bucket/f3.mdio "
    "read through fsspec (endpoint and credentials from the environment, e.g. "
    "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, or --storage-option)."
)

Seed = Annotated[int, Field(description="Random seed of positions, masks and the model.")]
Device = Annotated[str, Field(description="auto, cpu or cuda.")]

FIT = FitOptions(data="")
"""``fit``'s defaults: those of the options a program gives :func:`trainer.train.fit`."""


class TrainSettings(BaseSettings):
    """What every command's settings are: flags, then ``STRATA_TRAIN_*`` variables."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")


class VolumeSettings(TrainSettings):
    """The volume a command reads."""

    data: str = Field(description=DATA_HELP)
    storage_option: tuple[str, ...] = Field(
        default=(),
        description="KEY=VALUE passed to the URL's fsspec filesystem (repeatable; JSON values "
        "such as true or 16 are parsed; ignored for a local path).",
    )


class SamplingSettings(VolumeSettings):
    """What decides which patches an epoch reads, and in what order."""

    preset: str = Field(default=FIT.preset, description=f"Model preset: {', '.join(PRESETS)}.")
    batch_size: int | None = Field(
        default=FIT.batch_size, description="Patches per step and rank (default: the preset's)."
    )
    seed: Seed = FIT.seed
    epoch_size: int = Field(
        default=FIT.epoch_size, description="Patch positions per epoch (all ranks)."
    )
    chunk_aligned: bool = Field(
        default=FIT.chunk_aligned, description="Place patches to read as few chunks as possible."
    )
    min_live: float = Field(
        default=FIT.min_live_fraction, description="Reject patches with fewer live traces."
    )


class LoaderSettings(SamplingSettings):
    """The DataLoader that reads them."""

    workers: int = Field(default=FIT.workers, description="DataLoader worker processes per rank.")
    mp_context: str = Field(
        default=FIT.mp_context, description="Worker start method: spawn or forkserver."
    )


class FitSettings(LoaderSettings):
    """``strata-train fit``: a training run (:class:`~trainer.options.FitOptions`)."""

    steps: int = Field(
        default=FIT.steps, description="Total optimiser steps (the schedule's length)."
    )
    out: Path = Field(default=FIT.out, description="Output directory (must not be inside --data).")
    log_every: int = Field(default=FIT.log_every, description="Write a metrics line every K steps.")
    lr: float | None = Field(
        default=FIT.lr, description="Peak learning rate (default: the preset's)."
    )
    threads: int | None = Field(
        default=FIT.threads, description="Torch threads (default: cores minus workers, >= half)."
    )
    device: Device = FIT.device
    amp: bool | None = Field(
        default=FIT.amp,
        description="bf16 autocast (default: on exactly when on CUDA).",
        json_schema_extra={"flag": "--amp/--no-amp"},
    )
    resume: bool = Field(default=FIT.resume, description="Continue exactly from OUT/checkpoint.pt.")
    checkpoint_every: int = Field(
        default=FIT.checkpoint_every, description="Steps between checkpoints (0: end only)."
    )
    stop_at: int | None = Field(
        default=FIT.stop_at, description="Stop after this step with a checkpoint (resume later)."
    )
    clip: float = Field(
        default=FIT.clip, description="Clip normalised amplitudes at this many sigma."
    )
    scale: float = Field(default=FIT.scale, description="Multiply clipped z-scores by this.")
    clip_grad: float = Field(default=FIT.clip_grad, description="Gradient-norm limit (0: off).")
    hints: str | None = Field(
        default=None, description="Post each epoch's read order to URL/v1/hints (opt-in)."
    )
    hints_dataset: str | None = Field(
        default=None, description="Default: the data path's grandparent."
    )
    hints_ref: str | None = Field(default=None, description="Default: the data path's parent.")
    hints_prefix: str | None = Field(
        default=None, description="Store path in the snapshot (its name)."
    )
    hints_token_file: Path | None = Field(default=None, description="Bearer token for --hints.")
    hints_stream: str | None = Field(
        default=None,
        description="Base name of the run's hint streams (rank N posts as NAME.rankN). "
        "Default: fit- and a hash of --out.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags, then ``STRATA_TRAIN_*`` variables, then the TOML file (:func:`config_file`)."""
        config = config_file()
        toml = [TomlConfigSettingsSource(settings_cls, toml_file=config)] if config else []
        return (init_settings, env_settings, *toml)


class LoadSettings(LoaderSettings):
    """``strata-train load``: the loader alone (:class:`~trainer.loadonly.LoadOptions`)."""

    source: str = Field(
        default="store",
        description="store: read the store; memory: the same volume from shared memory "
        "(the loader's own ceiling).",
    )
    epochs: int = Field(default=1, description="Whole epochs to read.")
    compute_ms: float = Field(
        default=0.0, description="Emulated compute time per batch, ms (0: none)."
    )
    json_out: Path | None = Field(
        default=None,
        description="Also write the summary to this file.",
        json_schema_extra={"flag": "--json"},
    )
    client: str = Field(
        default="fsspec",
        description="How a URL --data is read: fsspec, or obstore (zarr's ObjectStore).",
    )


class PlanSettings(SamplingSettings):
    """``strata-train plan``: the store keys an epoch of a run reads."""

    epoch: int = Field(default=0, description="Epoch (0-based).")
    rank: int = Field(default=0, description="Rank whose shard to list.")
    world_size: int = Field(default=1, description="Number of ranks.")
    all_reads: bool = Field(default=False, description="One line per chunk read, repeats included.")


class EvalSettings(VolumeSettings):
    """``strata-train eval``: PSNR and a section (:class:`~trainer.evaluate.EvalOptions`)."""

    ckpt: Path = Field(description="Checkpoint written by fit.")
    out: Path | None = Field(
        default=None, description="Output directory (default: the checkpoint's)."
    )
    patches: int = Field(default=256, description="Held-out patches for PSNR.")
    batch_size: int = Field(default=32, description="Patches per pass.")
    seed: Seed = 0
    mask_ratio: float | None = Field(
        default=None, description="Hidden fraction (default: the model's)."
    )
    inline: int | None = Field(
        default=None, description="Inline index of the section (default: middle)."
    )
    device: Device = "auto"


_CONFIG: ContextVar[Path | None] = ContextVar("strata_train_config", default=None)


def config_file() -> Path | None:
    """``fit``'s TOML file: ``--config``'s (:func:`reading`), else ``$STRATA_TRAIN_CONFIG``."""
    named = os.environ.get(CONFIG_ENV)
    return _CONFIG.get() or (Path(named) if named else None)


@contextlib.contextmanager
def reading(config: Path | None) -> Iterator[None]:
    """While inside, :func:`config_file` is ``config`` (None: leave it to the variable)."""
    token = _CONFIG.set(config)
    try:
        yield
    finally:
        _CONFIG.reset(token)
