"""A command's options declared once, as the fields of a settings model, and offered by typer.

Each option is a pydantic field: its name is the TOML key, ``--NAME`` (or the field's
``json_schema_extra["flag"]``) its flag, ``PREFIX + NAME`` its variable, the field's
default and description its default and help. The pieces, in the order a command uses them:

- :func:`declared` reads a model's fields as :class:`Option` records;
- :func:`with_options` gives a typer command a parameter per option, each defaulting to
  None, so that an option not given is left to the model (its variable, the config file,
  its default);
- :func:`given` folds the flags a command received into the model's values;
- :func:`load` builds the model from them: flags, then variables, then the TOML file of
  ``--config`` or of the model's config variable (:func:`config_sources`, which the
  model's ``settings_customise_sources`` returns);
- :func:`problem` makes a validation error one line that names the flag.

Used by ``strata-spoke run``/``daemon`` (:mod:`spoke.run.settings`) and ``strata-hub serve``
(:mod:`hub.cli.settings`). pydantic-settings' own command line (``CliSettingsSource``)
parses with argparse and owns ``--help``, errors and exit codes, which would leave the
commands two parsers; this keeps typer the one.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import typer
from pydantic import BaseModel, ByteSize, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    TomlConfigSettingsSource,
)


@dataclass(frozen=True)
class Option:
    """One option of a settings model, as a command line offers it (:func:`declared`)."""

    name: str
    """The keyword a command receives it as (``peer_listen``)."""
    field: str
    """Its field in its model (``listen`` of the spoke's ``MeshSettings``)."""
    flag: str
    """``--peer-listen``."""
    help: str
    kind: type
    """What a command line parses it to: ``str`` (sizes, lists and choices too), ``Path``,
    ``bool`` (a switch), ``int`` or ``float``; the model validates it."""
    choices: tuple[str, ...]
    default: Any
    env: str | None
    """Its variable (None: only the flag and the TOML file set it)."""
    commands: tuple[str, ...]
    """The commands that take it (``json_schema_extra["commands"]``, else those
    :func:`declared` was given)."""
    section: str | None = None
    """The field of the enclosing settings that holds its model (its TOML table, e.g.
    ``mesh``); None for a field of the settings themselves."""


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, UnionType):
        (inner,) = (a for a in get_args(annotation) if a is not type(None))
        return inner
    return annotation


def _kind(annotation: Any) -> tuple[type, tuple[str, ...]]:
    inner = _without_none(annotation)
    if get_origin(inner) is Literal:
        return str, tuple(str(c) for c in get_args(inner))
    if inner is ByteSize or get_origin(inner) is tuple:  # 10GiB; a:1,b:2
        return str, ()
    if inner in (bool, int, float, str, Path):
        return inner, ()
    raise TypeError(f"no command-line form for {annotation!r}")


def _option(
    model: type[BaseModel],
    name: str,
    env_prefix: str | None,
    section: str | None,
    commands: tuple[str, ...],
) -> Option:
    info = model.model_fields[name]
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    flag = str(extra.get("flag", "--" + name.replace("_", "-")))
    kind, choices = _kind(info.annotation)
    taken_by = extra.get("commands", list(commands))
    assert isinstance(taken_by, list)
    return Option(
        name=flag.removeprefix("--").replace("-", "_"),
        field=name,
        flag=flag,
        help=info.description or "",
        kind=kind,
        choices=choices,
        default=None if info.is_required() else info.default,
        env=env_prefix + name.upper() if env_prefix is not None else None,
        commands=tuple(str(c) for c in taken_by),
        section=section,
    )


def declared(
    model: type[BaseModel],
    names: Iterable[str] | None = None,
    env_prefix: str | None = None,
    *,
    section: str | None = None,
    commands: tuple[str, ...] = (),
) -> tuple[Option, ...]:
    """The options ``model`` declares (those of ``names``; all by default), in declaration
    order: a field's flag is ``--NAME`` unless its ``json_schema_extra`` gives ``flag``;
    the commands that take it are ``commands`` unless it gives ``commands``."""
    chosen = list(model.model_fields) if names is None else list(names)
    return tuple(_option(model, name, env_prefix, section, commands) for name in chosen)


def help_text(option: Option) -> str:
    """An option's help: its description, default and variable, from the schema."""
    notes = []
    if option.default not in (None, False, ()):
        shown = option.default
        if isinstance(shown, ByteSize):
            shown = shown.human_readable(decimal=False).replace(".0", "")
        notes.append(f"default {shown}")
    if option.env is not None:
        notes.append(f"${option.env}")
    return f"{option.help} ({'; '.join(notes)})" if notes else option.help


def parameter(name: str, annotation: object) -> inspect.Parameter:
    """A keyword parameter of a typer command, None when not given."""
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
    )


def config_parameter(env: str) -> inspect.Parameter:
    """``--config FILE``: the TOML file of settings (:func:`load`)."""
    help = f"TOML file of settings (or ${env}); variables and flags win"
    return parameter("config", Annotated[Path | None, typer.Option("--config", help=help)])


def parameters(options: Iterable[Option], command: str | None = None) -> list[inspect.Parameter]:
    """The typer parameters of ``options`` (those ``command`` takes; all for None)."""
    return [
        parameter(
            option.name,
            Annotated[
                option.kind | None,  # type: ignore[operator]
                typer.Option(option.flag, help=help_text(option), show_default=False),
            ],
        )
        for option in options
        if command is None or command in option.commands
    ]


Command = TypeVar("Command", bound=Callable[..., Any])


def with_options(
    options: Iterable[Option], *own: inspect.Parameter, command: str | None = None
) -> Callable[[Command], Command]:
    """Give a command taking ``**options`` the parameters ``own`` and those of ``options``
    it takes (typer reads a function's ``__signature__``), so it declares no option."""

    def wrap(function: Command) -> Command:
        signature = inspect.Signature([*own, *parameters(options, command)])
        setattr(function, "__signature__", signature)  # noqa: B010
        return function

    return wrap


def given(options: Iterable[Option], received: dict[str, Any]) -> dict[str, Any]:
    """The model's values of the flags a command received (None: not given), by field;
    those of a section (``mesh``) are left to the caller."""
    return {
        option.field: received[option.name]
        for option in options
        if option.section is None and received.get(option.name) is not None
    }


_CONFIG: ContextVar[Path | None] = ContextVar("strata_config_file", default=None)


def config_sources(
    settings_cls: type[BaseSettings],
    flags: PydanticBaseSettingsSource,
    variables: PydanticBaseSettingsSource,
    config_env: str,
) -> tuple[PydanticBaseSettingsSource, ...]:
    """A model's sources, first wins: the flags (its keyword arguments), its variables, then
    the TOML file of :func:`load`'s ``config``, else of ``$config_env``."""
    sources: list[PydanticBaseSettingsSource] = [flags, variables]
    config = _CONFIG.get() or os.environ.get(config_env)
    if config:
        sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config)))
    return tuple(sources)


Settings = TypeVar("Settings", bound=BaseSettings)


class ConfigFileError(ValueError):
    """The config file is missing, unreadable or not TOML; the message is one line."""


def load(
    settings_cls: type[Settings], values: dict[str, Any], config: Path | None, config_env: str
) -> Settings:
    """``settings_cls`` from ``values`` (the flags), its variables and the TOML file
    ``config`` (None: the one ``$config_env`` names, if any).

    Raises:
        ConfigFileError: the file is missing, unreadable or malformed.
        pydantic.ValidationError: the settings are not valid (:func:`problem`).
    """
    if config is not None and not config.is_file():
        raise ConfigFileError(f"--config {config}: no such file")
    named = os.environ.get(config_env)
    if config is None and named and not Path(named).is_file():
        raise ConfigFileError(f"${config_env} {named}: no such file")
    token = _CONFIG.set(config)
    try:
        return settings_cls(**values)
    except ValidationError:
        raise
    except (OSError, ValueError) as err:  # tomllib.TOMLDecodeError is a ValueError
        where = config or os.environ.get(config_env)
        raise ConfigFileError(f"config file {where}: {err}") from None
    finally:
        _CONFIG.reset(token)


def problem(err: ValidationError, options: Iterable[Option], env_prefix: str) -> str:
    """The first problem of ``err`` as one line naming its flag (or its TOML key)."""
    first = err.errors()[0]
    loc = [str(p) for p in first["loc"]]
    flags = {o.field: o.flag for o in options if o.section is None}
    where = flags.get(loc[0], "--" + ".".join(loc).replace("_", "-")) if loc else ""
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "missing":
        return f"{where} is required (the flag, ${env_prefix}{loc[0].upper()} or the config file)"
    if first["type"] == "extra_forbidden":
        return f"{'.'.join(loc)}: no such setting (a key of the config file); see --help"
    if not where:
        return message
    return message if message.startswith("--") else f"{where}: {message}"
