"""What every ``strata-train`` command shares (:mod:`trainer.cli`, :mod:`trainer.datacli`):
:func:`with_settings`, which gives a command the typer options of its settings
(:mod:`trainer.settings`, their one declaration), :func:`settings`, which reads them back
(flags, then ``STRATA_TRAIN_*`` variables, then a config file), the ``--storage-option``
parsing, and :func:`fail`, the one-line error with exit status :data:`EXIT_USAGE`.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, NoReturn, TypeVar, Union, get_args, get_origin

import typer
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from trainer.location import parse_storage_options
from trainer.settings import CONFIG_ENV, ENV_PREFIX, TrainSettings, reading

EXIT_USAGE = 2

Settings = TypeVar("Settings", bound=TrainSettings)
Command = TypeVar("Command", bound=Callable[..., None])


def _flag(name: str, info: FieldInfo) -> str:
    """``--NAME``, or the field's ``json_schema_extra["flag"]`` (``--amp/--no-amp``)."""
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return str(extra.get("flag", "--" + name.replace("_", "-")))


def _parsed_as(annotation: Any) -> Any:
    """What typer parses a field's flag to (the model validates it): a tuple is a repeated
    flag, anything optional is what it is when given."""
    if get_origin(annotation) in (Union, UnionType):
        (annotation,) = (a for a in get_args(annotation) if a is not type(None))
    return list[str] if get_origin(annotation) is tuple else annotation


def _option(name: str, info: FieldInfo) -> inspect.Parameter:
    shown = not (info.default is None or info.default is False or info.default == ())
    notes = [f"default {info.default}"] if shown and info.default is not PydanticUndefined else []
    notes.append(f"${ENV_PREFIX}{name.upper()}")
    option = typer.Option(
        _flag(name, info), help=f"{info.description} ({'; '.join(notes)})", show_default=False
    )
    annotation = Annotated[_parsed_as(info.annotation) | None, option]  # type: ignore[valid-type]
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
    )


def config_option() -> inspect.Parameter:
    """``--config FILE``: the TOML file of a command's settings (``fit``'s)."""
    help = f"TOML file of settings, by their names (or ${CONFIG_ENV}); variables and flags win."
    option = typer.Option("--config", help=help, show_default=False)
    return inspect.Parameter(
        "config",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[Path | None, option],
    )


def with_settings(
    model: type[TrainSettings], *own: inspect.Parameter
) -> Callable[[Command], Command]:
    """Give a command taking ``**given`` the parameters ``own`` and an option per field of
    ``model`` (typer reads a function's ``__signature__``), each None when not given."""
    options = [_option(name, info) for name, info in model.model_fields.items()]

    def wrap(command: Command) -> Command:
        setattr(command, "__signature__", inspect.Signature([*own, *options]))  # noqa: B010
        return command

    return wrap


def settings(model: type[Settings], given: dict[str, Any]) -> Settings:
    """``model`` from the flags ``given`` (None: not given), the ``STRATA_TRAIN_*`` variables
    and the TOML file of ``given["config"]`` or ``$STRATA_TRAIN_CONFIG`` (``fit``'s); a
    problem is a one-line error."""
    config = given.get("config")
    named = os.environ.get(CONFIG_ENV) if "config" in given else None
    for path, what in ((config, "--config"), (named and Path(named), f"${CONFIG_ENV}")):
        if path and not path.is_file():
            fail(f"{what} {path}: no such file")
    values = {
        name: tuple(value) if isinstance(value, list) else value
        for name, value in given.items()
        if name in model.model_fields and value not in (None, [])
    }
    try:
        with reading(config):
            return model(**values)
    except ValidationError as err:
        fail(_problem(err, model))
    except (OSError, ValueError) as err:  # an unreadable or malformed config file
        fail(f"config file {config or named}: {err}")


def _problem(err: ValidationError, model: type[TrainSettings]) -> str:
    first = err.errors()[0]
    name = str(first["loc"][0]) if first["loc"] else ""
    message = str(first["msg"]).removeprefix("Value error, ")
    if name not in model.model_fields:
        return f"{name}: no such setting (a key of the config file)" if name else message
    flag = _flag(name, model.model_fields[name]).partition("/")[0]
    if first["type"] == "missing":
        return f"{flag} is required (the flag or ${ENV_PREFIX}{name.upper()})"
    return f"{flag}: {message}"


def storage_options(items: Iterable[str]) -> dict[str, object]:
    """``--storage-option`` values as a dict (a bad one is a one-line error)."""
    try:
        return parse_storage_options(list(items))
    except ValueError as exc:
        fail(str(exc))


def fail(message: str) -> NoReturn:
    """Print a one-line error on stderr and exit with status 2."""
    line = " ".join(message.split())
    typer.echo(f"strata-train: error: {line}", err=True)
    raise typer.Exit(EXIT_USAGE)
