"""``strata-spoke``: run a spoke (daemon + mount), or talk to a running one."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import httpx
import typer
from pydantic import ValidationError
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from spoke.mesh.settings import MeshSettings
from spoke.run.settings import CONFIG_ENV, SpokeSettings, options, read_settings
from spoke.run.startup import StartupError
from spoke.run.supervisor import Supervisor
from strata_local.options import (
    ConfigFileError,
    config_parameter,
    load,
    parameter,
    problem,
    with_options,
)

app = typer.Typer(
    name="strata-spoke",
    help="A Strata spoke: a block cache near the GPUs and a read-only FUSE mount of hub snapshots.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

SettingsFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--settings",
        hidden=True,
        help="validated settings as JSON (written by strata-spoke run); no other flags",
    ),
]


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"strata-spoke: error: {message}", err=True)
    raise typer.Exit(code)


def _invalid(err: ValidationError) -> NoReturn:
    """Exit with the first problem of ``err`` as one line naming its flag."""
    _fail(problem(err, OPTIONS, "STRATA_SPOKE_"))


OPTIONS = options()
"""Every option of ``run`` and ``daemon``, from the one schema (:class:`SpokeSettings`)."""


def _with_mesh(given: dict[str, Any]) -> dict[str, Any]:
    """The settings' values from a command's options: the flags given (None: not given),
    with the ``--peer-*`` ones folded into one ``mesh`` setting (needs ``--peer-listen``)."""
    values: dict[str, Any] = {}
    mesh: dict[str, Any] = {}
    for option in OPTIONS:
        value = given.get(option.name)
        if value is not None:
            (mesh if option.mesh else values)[option.field] = value
    if mesh and "listen" not in mesh:
        _fail("--peers, --peers-dns and the other --peer-* flags need --peer-listen")
    if mesh:
        try:
            values["mesh"] = MeshSettings(**mesh)
        except ValidationError as err:
            message = str(err.errors()[0]["msg"]).removeprefix("Value error, ")
            _fail(message if message.startswith("--") else f"--peer-*: {message}")
    return values


def _settings(config: Path | None, given: dict[str, Any]) -> SpokeSettings:
    """Settings from the flags given (None: not given), the environment and the config file."""
    values = _with_mesh(given)
    try:
        return load(SpokeSettings, values, config, CONFIG_ENV)
    except ValidationError as err:
        _invalid(err)
    except ConfigFileError as err:
        _fail(str(err))


def _from_file(path: Path, given: dict[str, Any]) -> SpokeSettings:
    """The settings a supervisor handed its daemon (``--settings``), and nothing else."""
    flags = [o.flag for o in OPTIONS if given.get(o.name) is not None]
    if flags:
        _fail(f"--settings takes no other settings: {' '.join(flags)}")
    try:
        return read_settings(SpokeSettings, path)
    except ValidationError as err:
        _invalid(err)
    except OSError as err:
        _fail(f"--settings {path}: {err.strerror or err}")


def _logging(level: str, who: str) -> None:
    logging.basicConfig(
        level=level, format=f"%(asctime)s {who} %(levelname)s %(name)s: %(message)s"
    )


@app.command()
@with_options(OPTIONS, config_parameter(CONFIG_ENV), command="run")
def run(**options: Any) -> None:
    """Start the spoke daemon and its mount; stop both on SIGINT/SIGTERM.

    SIGHUP upgrades in place (new supervisor and daemon code; the mount process and its
    open files stay); SIGUSR1 exits leaving both serving for the next ``run`` to adopt.
    """
    settings = _settings(options.pop("config"), options)
    _logging(settings.log_level, "strata-spoke")
    try:
        code = Supervisor(settings).run()
    except StartupError as err:
        _fail(str(err), 1)
    raise typer.Exit(code)


@app.command(hidden=True)
@with_options(
    OPTIONS,
    config_parameter(CONFIG_ENV),
    parameter("settings", SettingsFileOpt),
    command="daemon",
)
def daemon(**options: Any) -> None:
    """Run only the daemon (``run`` starts it for you, with ``--settings``)."""
    config, path = options.pop("config"), options.pop("settings")
    if path is not None and config is not None:
        _fail("--settings takes no other settings: --config")
    settings = _from_file(path, options) if path is not None else _settings(config, options)
    _logging(settings.log_level, "strata-spoke-daemon")
    from spoke.disk.encryption import EncryptionError
    from spoke.disk.hardening import UnsafeDirectory
    from spoke.run.daemon import run_daemon  # grpc.aio and uvicorn only in this process
    from spoke.run.lock import CacheInUse
    from strata_local.memory import limit_malloc_arenas

    limit_malloc_arenas()  # before gRPC starts its threads (strata_local/memory.py)

    try:
        asyncio.run(run_daemon(settings))
    except CacheInUse as err:
        _fail(f"daemon: {err.strerror}")
    except (EncryptionError, UnsafeDirectory) as err:
        _fail(f"daemon: {err}")
    except OSError as err:
        _fail(f"daemon: {err.strerror or err} ({settings.admin})")


def _client(admin: str | None, token_file: Path | None, cache_dir: Path | None) -> httpx.Client:
    """An admin API client: URL from ``--admin`` or ``CACHE_DIR/admin.url``; token from
    ``--admin-token-file`` or the one the daemon generated, ``CACHE_DIR/admin.token``."""
    from spoke.disk.hardening import admin_token_path
    from spoke.disk.layout import CacheLayout

    layout = CacheLayout(cache_dir) if cache_dir is not None else None
    if admin is None:
        if layout is None:
            _fail("give --admin URL or --cache-dir DIR (of a running spoke)")
        try:
            admin = layout.admin_url_file.read_text().strip()
        except OSError as err:
            _fail(f"--cache-dir {cache_dir}: no running spoke ({err.strerror})")
    if token_file is None and layout is not None and admin_token_path(layout).exists():
        token_file = admin_token_path(layout)
    url = admin if admin.startswith("http") else f"http://{admin}"
    headers = {}
    if token_file is not None:
        try:
            headers["Authorization"] = f"Bearer {token_file.read_text().strip()}"
        except OSError as err:
            _fail(f"--admin-token-file {token_file}: {err.strerror}")
    return httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=30.0)


def _check(reply: httpx.Response) -> Any:
    if reply.is_success:
        return reply.json()
    try:
        detail = reply.json().get("detail", reply.text)
    except ValueError:
        detail = reply.text
    if isinstance(detail, list):  # FastAPI's 422: a list of problems; the first says enough
        first = detail[0] if detail and isinstance(detail[0], dict) else {}
        where = ".".join(str(p) for p in first.get("loc", [])[1:]) or "request"
        detail = f"{where}: {first.get('msg', detail)}"
    _fail(f"admin API {reply.request.url.path}: {reply.status_code} {detail}", 1)


AdminUrlOpt = Annotated[
    str | None,
    typer.Option("--admin", help="admin API URL, e.g. http://127.0.0.1:7878 (or --cache-dir)"),
]
TokenFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--admin-token-file",
        help="file with the admin API's bearer token (default: CACHE_DIR/admin.token)",
    ),
]
OldTokenFileOpt = Annotated[
    Path | None, typer.Option("--token-file", hidden=True, help="old name of --admin-token-file")
]
ClientCacheDirOpt = Annotated[
    Path | None,
    typer.Option("--cache-dir", help="the spoke's cache dir: finds its admin URL and token"),
]


@app.command()
def prewarm(
    target: Annotated[str, typer.Argument(help="DATASET or DATASET@REF (a version or tag)")],
    paths: Annotated[
        list[str] | None, typer.Argument(help="globs relative to the snapshot root")
    ] = None,
    pin: Annotated[bool, typer.Option("--pin", help="also pin what is prewarmed")] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="show progress until done; non-zero exit on failure")
    ] = False,
    admin: AdminUrlOpt = None,
    admin_token_file: TokenFileOpt = None,
    token_file: OldTokenFileOpt = None,
    cache_dir: ClientCacheDirOpt = None,
) -> None:
    """Fetch a snapshot's files (all, or those matching GLOBs) into the spoke's cache."""
    dataset, at, ref = target.partition("@")
    if at and not ref:
        _fail(f"{target!r}: give a version or tag after '@', or leave '@' out for latest")
    body = {"dataset": dataset, "ref": ref or "latest", "paths": paths or [], "pin": pin}
    try:
        with _client(admin, admin_token_file or token_file, cache_dir) as client:
            job = _check(client.post("/v1/prewarm", json=body))
            typer.echo(
                f"prewarm job {job['id']}: {job['files']} files, "
                f"{job['bytes_total']:,} bytes of {dataset}@{job['version']}"
            )
            if not wait:
                return
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                transient=False,
            ) as progress:
                bar = progress.add_task("prewarm", total=job["bytes_total"])
                while job["state"] == "running":
                    time.sleep(0.5)
                    job = _check(client.get(f"/v1/jobs/{job['id']}"))
                    progress.update(bar, completed=job["bytes_done"])
    except httpx.HTTPError as err:
        _fail(f"admin API {admin}: {err}", 1)
    if job["message"]:
        typer.echo(job["message"])
    if job["state"] != "done":
        _fail(f"prewarm job {job['id']} {job['state']}: {job['error'] or ''}".rstrip(": "), 1)
    typer.echo(f"prewarm job {job['id']} done: {job['cached_bytes']:,} bytes cached")


@app.command()
def status(
    admin: AdminUrlOpt = None,
    admin_token_file: TokenFileOpt = None,
    token_file: OldTokenFileOpt = None,
    cache_dir: ClientCacheDirOpt = None,
) -> None:
    """Print the cache statistics of a running spoke as JSON."""
    try:
        with _client(admin, admin_token_file or token_file, cache_dir) as client:
            stats = _check(client.get("/v1/cache"))
    except httpx.HTTPError as err:
        _fail(f"admin API {admin}: {err}", 1)
    typer.echo(json.dumps(stats, indent=2))
    for line in fill_lines(stats.get("fill") or {}):
        typer.echo(line, err=True)


def fill_lines(fill: dict[str, Any], width: int = 30) -> list[str]:
    """One progress line per background fill of ``GET /v1/cache``'s ``fill``:
    ``fill f3@v1 [#######-------] 52% 230/444 MB 110 MB/s ETA 2 s filling``."""
    lines = []
    for snap in fill.get("snapshots", []):
        total = max(1, int(snap["bytes_total"]))
        done = int(snap["bytes_resident"])
        bar = "#" * round(width * done / total)
        eta = f" ETA {snap['eta_s']:.0f} s" if snap.get("eta_s") is not None else ""
        why = f" ({snap['reason']})" if snap.get("reason") else ""
        lines.append(
            f"fill {snap['snapshot']} [{bar:-<{width}}] {100 * done / total:3.0f}% "
            f"{done / 1e6:,.0f}/{total / 1e6:,.0f} MB "
            f"{snap['rate_bytes_per_s'] / 1e6:.1f} MB/s{eta} {snap['state']}{why}"
        )
    return lines


@app.command("encryption-key")
def encryption_key(
    path: Annotated[Path, typer.Argument(help="where to write the new key (must not exist)")],
) -> None:
    """Write a new random key for --encryption-key-file (mode 0600)."""
    from spoke.disk.encryption import write_key

    try:
        write_key(path)
    except FileExistsError:
        _fail(f"{path} exists: a key is never overwritten (the blocks it sealed need it)")
    except OSError as err:
        _fail(f"{path}: {err.strerror or err}")
    typer.echo(f"wrote a 256-bit key to {path} (a cache dir written with it opens only with it)")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
    sys.exit(0)
