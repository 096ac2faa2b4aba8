"""The one schema of the spoke's options, and how it reaches the processes it runs.

Every option is declared once, as a pydantic field: its name is the TOML key, ``--NAME``
(or the field's ``json_schema_extra["flag"]``) its flag, ``STRATA_SPOKE_NAME`` its variable,
and the field's default and description its default and help. :func:`declared` reads those
declarations (with :mod:`strata_local.options`, which the hub's ``serve`` shares) for the
command lines that offer them (``strata-spoke``'s typer options, ``strata-mount``'s
argparse flags), so no command line declares an option itself.

A supervisor hands a child process its validated settings as a file, never as flags:
:func:`write_settings` writes them owner-only into the cache's private directory under a
name that is their digest, and the child reads them back with :func:`read_settings`.

:class:`MountSettings` lives here rather than in :mod:`spoke.run.settings` because the mount
imports it, and may import only the read side of the spoke.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import NoDecode

from spoke.disk import datasetgroups
from spoke.disk.encryption import BlockCipher, EncryptionError, load_key
from strata_local import options

__all__ = [
    "DAEMON",
    "RUN",
    "MountSettings",
    "Option",
    "declared",
    "read_settings",
    "resolved",
    "settings_file",
    "write_settings",
]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

RUN = "run"
DAEMON = "daemon"
"""The ``strata-spoke`` commands an option may belong to (``json_schema_extra["commands"]``;
both by default): the mount's own options are ``run``'s alone."""


class MountSettings(BaseModel):
    """What the mount process (``fusemount``) needs: the part of :class:`SpokeSettings` the
    supervisor hands it in its settings file, and the options ``strata-mount`` takes."""

    model_config = ConfigDict(extra="forbid")

    cache_dir: Path = Field(description="directory of the block cache")
    miss_deadline: float = Field(
        default=60.0, gt=0, description="seconds a miss may wait for the hub, then EIO"
    )
    allow_other: bool = Field(
        default=False,
        description="let other users read the mount (the kernel checks the file modes)",
        json_schema_extra={"commands": [RUN]},
    )
    read_ahead_kb: int = Field(
        default=1024,
        ge=0,
        description="kernel readahead window of the mount, KiB (0 leaves it)",
        json_schema_extra={"commands": [RUN]},
    )
    passthrough: Literal["auto", "off"] = Field(
        default="auto",
        description="let the kernel read cached one-block files itself (FUSE passthrough) "
        "where the kernel, libfuse and privileges allow it (auto), or never (off)",
        json_schema_extra={"commands": [RUN]},
    )
    mount_handover: Literal["auto", "off"] = Field(
        default="auto",
        description="keep the FUSE connection when the mount process dies or is upgraded "
        "(SIGHUP): a successor resumes it and readers holding files see a delay, not "
        "ENOTCONN (auto, where pyfuse3 and the kernel allow it), or remount (off)",
        json_schema_extra={"commands": [RUN]},
    )
    mount_workers: int = Field(
        default=0,
        ge=0,
        le=64,
        description="mount processes serving the one FUSE connection, each with its own "
        "GIL (needs hand-over; 0: one per 4 cores, 1 to 8)",
        json_schema_extra={"commands": [RUN]},
    )
    readable_by_all: bool = Field(
        default=False,
        description="present every file of a snapshot readable, and every directory "
        "searchable, by any uid (mode | 0444, | 0555), whatever its published modes: for "
        "pods that run as any user (with --allow-other)",
        json_schema_extra={"commands": [RUN]},
    )
    mount_uid: int | None = Field(
        default=None,
        ge=0,
        description="owner uid every file and directory of the mount shows (default: the "
        "mount process's): the kernel checks the published owner bits against it",
        json_schema_extra={"commands": [RUN]},
    )
    mount_gid: int | None = Field(
        default=None,
        ge=0,
        description="owner gid every file and directory of the mount shows (default: the "
        "mount process's)",
        json_schema_extra={"commands": [RUN]},
    )
    dataset_groups: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="per-dataset UNIX groups, GLOB=GROUP,GLOB=GROUP,… (dataset-name globs, "
        "first match wins; GROUP a name or gid): every dataset directory shows owner root, "
        "mode 0550 and the first matching group (root where none matches), so with "
        "--allow-other only root and that group's members enter it; none: as published",
        json_schema_extra={"commands": [RUN]},
    )
    encryption_key_file: Path | None = Field(
        default=None,
        description="encrypt block files at rest with this AES-256-GCM key (0600; "
        "strata-spoke encryption-key FILE makes one)",
    )
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR")

    def block_cipher(self) -> BlockCipher | None:
        """The block-file cipher of ``--encryption-key-file`` (None: encryption off).

        Raises:
            EncryptionError: the key file is missing, unreadable, too open or malformed.
        """
        if self.encryption_key_file is None:
            return None
        return BlockCipher.from_file(self.encryption_key_file)

    @field_validator("encryption_key_file")
    @classmethod
    def _encryption_key(cls, v: Path | None) -> Path | None:
        if v is not None:
            try:
                load_key(v)
            except EncryptionError as err:
                raise ValueError(str(err)) from None
        return v

    @field_validator("dataset_groups", mode="before")
    @classmethod
    def _dataset_group_list(cls, v: object) -> object:
        """``--dataset-groups a*=g,b=h`` (or a variable's string) as the tuple it stands for."""
        return datasetgroups.split(v) if isinstance(v, str) else v

    @field_validator("dataset_groups")
    @classmethod
    def _dataset_groups(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return datasetgroups.resolve(v)  # GLOB=GID: the mount never looks a name up

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, v: str) -> str:
        if v.upper() not in LOG_LEVELS:
            raise ValueError(f"{v!r} is not one of {', '.join(LOG_LEVELS)}")
        return v.upper()


@dataclass(frozen=True)
class Option(options.Option):
    """One option of the spoke's schema (:class:`strata_local.options.Option`)."""

    @property
    def mesh(self) -> bool:
        """A field of :class:`~spoke.mesh.settings.MeshSettings` (``--peer-*``)."""
        return self.section == "mesh"


def declared(
    model: type[BaseModel],
    names: list[str] | None = None,
    env_prefix: str | None = None,
    *,
    mesh: bool = False,
) -> tuple[Option, ...]:
    """The options ``model`` declares (those of ``names``; all by default), in declaration
    order (:func:`strata_local.options.declared`): the commands that take one are ``run``
    and ``daemon`` unless its ``json_schema_extra`` gives ``commands``; ``mesh``: they are
    the ``[mesh]`` table's."""
    section = "mesh" if mesh else None
    found = options.declared(model, names, env_prefix, section=section, commands=(RUN, DAEMON))
    return tuple(Option(**vars(option)) for option in found)


Model = TypeVar("Model", bound=BaseModel)


def resolved(model: Model, **update: Any) -> Model:
    """A copy of ``model`` whose paths are absolute and resolved (a child process may run
    elsewhere), nested models' too, with ``update`` applied (its paths left as given)."""
    changes: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if name in update:
            continue
        if isinstance(value, Path):
            changes[name] = value.resolve()
        elif isinstance(value, BaseModel):
            changes[name] = resolved(value)
    return model.model_copy(update={**changes, **update})


def settings_file(model: BaseModel, directory: Path, role: str) -> tuple[Path, str]:
    """Where ``model`` is handed to a child and what that file holds: ``ROLE-DIGEST.json`` in
    ``directory``, named by its content, so a child's command line says which settings it
    runs with (the supervisor adopts a running child only with the same ones)."""
    text = model.model_dump_json()
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return directory / f"{role}-{digest}.json", text


def write_settings(model: BaseModel, directory: Path, role: str) -> Path:
    """Write :func:`settings_file` owner-only (0600) and atomically, and remove the files of
    ``role`` other settings left there.

    Returns:
        Its path, for the child's ``--settings``.
    """
    path, text = settings_file(model, directory, role)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)
    for old in directory.glob(f"{role}-*.json"):
        if old != path:
            old.unlink(missing_ok=True)
    return path


def read_settings(model: type[Model], path: Path) -> Model:
    """The settings a parent wrote to ``path`` (:func:`write_settings`), validated again;
    nothing else (flags, variables, a TOML file) is read.

    Raises:
        OSError: the file cannot be read.
        pydantic.ValidationError: it does not hold valid settings.
    """
    return model.model_validate_json(path.read_text())
