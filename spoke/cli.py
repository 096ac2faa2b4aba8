"""``strata-spoke``: run a spoke (daemon + mount), or talk to a running one."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import httpx
import typer
from pydantic import ValidationError

from spoke.config import SpokeSettings
from spoke.supervisor import StartupError, Supervisor

app = typer.Typer(
    name="strata-spoke",
    help="A Strata spoke: a block cache near the GPUs and a read-only FUSE mount of hub snapshots.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

HubOpt = Annotated[str, typer.Option("--hub", help="the hub's HOST:PORT")]
CacheDirOpt = Annotated[Path, typer.Option("--cache-dir", help="block cache directory")]
CacheSizeOpt = Annotated[
    str, typer.Option("--cache-size", help="most bytes of blocks kept, e.g. 10GiB")
]
AdminOpt = Annotated[
    str, typer.Option("--admin", help="admin API HOST:PORT (port 0 picks a free one)")
]
PolicyOpt = Annotated[str, typer.Option("--policy", help="eviction policy: arc or lru")]
DeadlineOpt = Annotated[
    float, typer.Option("--miss-deadline", help="seconds a miss may wait for the hub, then EIO")
]
LogOpt = Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING, ERROR")]


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"strata-spoke: error: {message}", err=True)
    raise typer.Exit(code)


def _settings(**values: object) -> SpokeSettings:
    try:
        return SpokeSettings(**values)  # type: ignore[arg-type]
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]).replace("_", "-")
        message = str(first["msg"]).removeprefix("Value error, ")
        _fail(message if message.startswith("--") else f"--{where}: {message}")


def _logging(level: str, who: str) -> None:
    logging.basicConfig(
        level=level.upper(), format=f"%(asctime)s {who} %(levelname)s %(name)s: %(message)s"
    )


@app.command()
def run(
    hub: HubOpt,
    cache_dir: CacheDirOpt,
    cache_size: CacheSizeOpt,
    mount: Annotated[Path, typer.Option("--mount", help="mountpoint (an existing directory)")],
    admin: AdminOpt = "127.0.0.1:7878",
    policy: PolicyOpt = "arc",
    miss_deadline: DeadlineOpt = 60.0,
    allow_other: Annotated[
        bool, typer.Option("--allow-other", help="let other users read the mount")
    ] = False,
    read_ahead_kb: Annotated[
        int, typer.Option("--read-ahead-kb", help="kernel readahead of the mount, KiB")
    ] = 1024,
    log_level: LogOpt = "INFO",
) -> None:
    """Start the spoke daemon and its mount; stop both on SIGINT/SIGTERM."""
    settings = _settings(
        hub=hub,
        cache_dir=cache_dir,
        cache_size=cache_size,
        mount=mount,
        admin=admin,
        policy=policy,
        miss_deadline=miss_deadline,
        allow_other=allow_other,
        read_ahead_kb=read_ahead_kb,
    )
    _logging(log_level, "strata-spoke")
    try:
        code = Supervisor(settings, log_level).run()
    except StartupError as err:
        _fail(str(err), 1)
    raise typer.Exit(code)


@app.command(hidden=True)
def daemon(
    hub: HubOpt,
    cache_dir: CacheDirOpt,
    cache_size: CacheSizeOpt,
    admin: AdminOpt = "127.0.0.1:7878",
    policy: PolicyOpt = "arc",
    miss_deadline: DeadlineOpt = 60.0,
    log_level: LogOpt = "INFO",
) -> None:
    """Run only the daemon (``run`` starts it for you)."""
    from spoke.daemon import run_daemon  # grpc.aio and uvicorn only in this process

    settings = _settings(
        hub=hub,
        cache_dir=cache_dir,
        cache_size=cache_size,
        admin=admin,
        policy=policy,
        miss_deadline=miss_deadline,
    )
    _logging(log_level, "strata-spoke-daemon")
    try:
        asyncio.run(run_daemon(settings))
    except OSError as err:
        _fail(f"daemon: {err.strerror or err} ({admin})")


@app.command()
def status(
    admin: Annotated[
        str, typer.Option("--admin", help="admin API URL, e.g. http://127.0.0.1:7878")
    ],
) -> None:
    """Print the cache statistics of a running spoke as JSON."""
    url = admin if admin.startswith("http") else f"http://{admin}"
    try:
        reply = httpx.get(f"{url.rstrip('/')}/v1/cache", timeout=5.0)
        reply.raise_for_status()
    except httpx.HTTPError as err:
        _fail(f"admin API {url}: {err}", 1)
    typer.echo(json.dumps(reply.json(), indent=2))


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
    sys.exit(0)
