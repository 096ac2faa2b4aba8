"""``strata-spoke``: run a spoke (daemon + mount), or talk to a running one."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

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

from spoke.mesh.settings import MeshSettings, split_peers
from spoke.run.settings import CONFIG_ENV, SpokeSettings
from spoke.run.supervisor import StartupError, Supervisor

app = typer.Typer(
    name="strata-spoke",
    help="A Strata spoke: a block cache near the GPUs and a read-only FUSE mount of hub snapshots.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

LogOpt = Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING, ERROR")]
TokenOpt = Annotated[
    Path | None,
    typer.Option(
        "--admin-token-file",
        help="file with the admin API's bearer token (default: made at first start, "
        "CACHE_DIR/admin.token)",
    ),
]
NoAdminTokenOpt = Annotated[
    bool | None,
    typer.Option("--no-admin-token", help="admin API without a token (any local user may use it)"),
]
RetentionOpt = Annotated[
    str | None,
    typer.Option("--retention", help="evict snapshots nobody read for this long, e.g. 7d"),
]
AuditLogOpt = Annotated[
    Path | None,
    typer.Option("--audit-log", help="JSON-lines audit log (default CACHE_DIR/audit.jsonl)"),
]
AuditMaxBytesOpt = Annotated[
    str | None,
    typer.Option(
        "--audit-max-bytes", help="rotate the audit log before it passes this, e.g. 16MiB"
    ),
]
AuditBackupsOpt = Annotated[
    int | None,
    typer.Option("--audit-backups", help="rotated audit logs kept (FILE.1 ...), default 4"),
]
EncryptionKeyOpt = Annotated[
    Path | None,
    typer.Option(
        "--encryption-key-file",
        help="encrypt block files at rest with this AES-256 key (0600; strata-spoke "
        "encryption-key FILE makes one)",
    ),
]
PublisherKeyOpt = Annotated[
    Path | None,
    typer.Option(
        "--publisher-key",
        help="Ed25519 public key (strata-hub keygen): serve only snapshots it signed",
    ),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", help=f"TOML file of settings (or ${CONFIG_ENV}); flags win"),
]
HubCaOpt = Annotated[
    Path | None, typer.Option("--hub-ca", help="PEM CA bundle the hub's certificate is from")
]
HubNameOpt = Annotated[
    str | None,
    typer.Option("--hub-server-name", help="name in the hub's certificate, if not its host"),
]
HubCertOpt = Annotated[
    Path | None, typer.Option("--hub-cert", help="PEM client certificate for mutual TLS")
]
HubKeyOpt = Annotated[Path | None, typer.Option("--hub-key", help="PEM key of --hub-cert")]
HubTokenOpt = Annotated[
    Path | None, typer.Option("--hub-token-file", help="file with the hub's bearer token")
]
HubTlsOpt = Annotated[
    bool | None, typer.Option("--hub-tls", help="TLS to the hub with the system's CA roots")
]
HubInsecureOpt = Annotated[
    bool | None,
    typer.Option("--hub-insecure", help="allow a hub token without TLS (trusted networks only)"),
]
FillOpt = Annotated[
    str,
    typer.Option(
        "--background-fill", help="auto: fetch the rest of snapshots being read; off: never"
    ),
]
FillRateOpt = Annotated[
    str | None,
    typer.Option("--fill-rate", help="most bytes per second the fill uses, e.g. 50MiB"),
]

PeerListenOpt = Annotated[
    str | None,
    typer.Option("--peer-listen", help="join the region's mesh: serve blocks on HOST:PORT"),
]
PeerAdvertiseOpt = Annotated[
    str | None,
    typer.Option("--peer-advertise", help="this spoke's HOST:PORT as peers dial it"),
]
PeersOpt = Annotated[
    str | None, typer.Option("--peers", help="the region's spokes, HOST:PORT,HOST:PORT,…")
]
PeersDnsOpt = Annotated[
    str | None,
    typer.Option("--peers-dns", help="NAME[:PORT] resolving to the region's spokes"),
]
PeerTokenOpt = Annotated[
    Path | None, typer.Option("--peer-token-file", help="file with the region's peer token")
]
PeerCertOpt = Annotated[
    Path | None, typer.Option("--peer-cert", help="TLS certificate of the peer port (PEM)")
]
PeerKeyOpt = Annotated[Path | None, typer.Option("--peer-key", help="its private key (PEM)")]
PeerCaOpt = Annotated[
    Path | None, typer.Option("--peer-ca", help="CA peers' certificates chain to (mTLS)")
]
PeerServerNameOpt = Annotated[
    str | None,
    typer.Option("--peer-server-name", help="name in peers' certificates, if not their host"),
]
PeerInsecureOpt = Annotated[
    bool | None,
    typer.Option(
        "--peer-insecure",
        help="allow a plaintext peer port without a region token (trusted networks only)",
    ),
]
PeerGrantKeyOpt = Annotated[
    Path | None,
    typer.Option(
        "--peer-grant-key",
        help="the hub's grant public key (PEM) to check peers' read grants with, "
        "instead of asking the hub",
    ),
]
PeerTimeoutOpt = Annotated[
    float, typer.Option("--peer-timeout", help="seconds a peer may take per block, then skipped")
]
PeerMaxConnectionsOpt = Annotated[
    int,
    typer.Option(
        "--peer-max-connections",
        help="most connections open to the peer port at once; more are closed as they arrive "
        "(each spoke of the region holds one to every other)",
    ),
]


def _mesh(
    listen: str | None,
    advertise: str | None,
    peers: str | None,
    peers_dns: str | None,
    token_file: Path | None,
    cert: Path | None,
    key: Path | None,
    ca: Path | None,
    server_name: str | None,
    insecure: bool | None,
    grant_key: Path | None,
    timeout: float,
    max_connections: int,
) -> MeshSettings | None:
    """The mesh settings from the ``--peer*`` flags; None without ``--peer-listen``."""
    if listen is None:
        given = (peers, peers_dns, advertise, token_file, cert, key, ca, server_name, grant_key)
        if any(given) or insecure:
            _fail("--peers, --peers-dns and the other --peer-* flags need --peer-listen")
        return None
    try:
        return MeshSettings(
            listen=listen,
            advertise=advertise,
            peers=split_peers(peers),
            peers_dns=peers_dns,
            token_file=token_file,
            cert=cert,
            key=key,
            ca=ca,
            server_name=server_name,
            insecure=bool(insecure),
            grant_key=grant_key,
            timeout=timeout,
            max_connections=max_connections,
        )
    except ValidationError as err:
        message = str(err.errors()[0]["msg"]).removeprefix("Value error, ")
        _fail(message if message.startswith("--") else f"--peer-*: {message}")


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"strata-spoke: error: {message}", err=True)
    raise typer.Exit(code)


def _settings(config: Path | None = None, **values: object) -> SpokeSettings:
    """Settings from the flags given (None: not given), the environment and the config file."""
    if config is not None:
        if not config.is_file():
            _fail(f"--config {config}: no such file")
        os.environ[CONFIG_ENV] = str(config)
    try:
        return SpokeSettings(**{k: v for k, v in values.items() if v is not None})  # type: ignore[arg-type]
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]).replace("_", "-")
        message = str(first["msg"]).removeprefix("Value error, ")
        if first["type"] == "missing":
            env = "STRATA_SPOKE_" + where.replace("-", "_").upper()
            _fail(f"--{where} is required (the flag, ${env} or the config file)")
        if not where:
            _fail(message)
        _fail(message if message.startswith("--") else f"--{where}: {message}")
    except (OSError, ValueError) as err:  # an unreadable or malformed config file
        _fail(f"config file {os.environ.get(CONFIG_ENV)}: {err}")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _logging(level: str, who: str) -> None:
    if level.upper() not in LOG_LEVELS:
        _fail(f"--log-level: {level!r} is not one of {', '.join(LOG_LEVELS)}")
    logging.basicConfig(
        level=level.upper(), format=f"%(asctime)s {who} %(levelname)s %(name)s: %(message)s"
    )


_PEER_OPTIONS = (
    "peer_listen",
    "peer_advertise",
    "peers",
    "peers_dns",
    "peer_token_file",
    "peer_cert",
    "peer_key",
    "peer_ca",
    "peer_server_name",
    "peer_insecure",
    "peer_grant_key",
    "peer_timeout",
    "peer_max_connections",
)


def _with_mesh(options: dict[str, Any]) -> dict[str, Any]:
    """A command's options with its ``--peer*`` flags folded into one ``mesh`` setting."""
    values = dict(options)
    values["mesh"] = _mesh(*(values.pop(name) for name in _PEER_OPTIONS))
    return values


def _configure(who: str, options: dict[str, Any]) -> SpokeSettings:
    """Validated settings from a command's options (its ``locals()``), and logging set up
    for ``who`` at the ``log_level`` among them; a bad value exits with a one-line error."""
    values = {k: v for k, v in options.items() if k != "log_level"}
    settings = _settings(**values)
    _logging(options["log_level"], who)
    return settings


def _shared(name: str, annotation: object, default: object = None) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


# The options ``run`` and ``daemon`` share, once. A default of None leaves the value to
# SpokeSettings (its defaults, STRATA_SPOKE_* variables, the config file); so does the help.
SPOKE_OPTIONS = (
    _shared("hub", Annotated[str | None, typer.Option("--hub", help="the hub's HOST:PORT")]),
    _shared(
        "cache_dir",
        Annotated[Path | None, typer.Option("--cache-dir", help="block cache directory")],
    ),
    _shared(
        "cache_size",
        Annotated[
            str | None, typer.Option("--cache-size", help="most bytes of blocks kept, e.g. 10GiB")
        ],
    ),
    _shared(
        "admin",
        Annotated[
            str | None,
            typer.Option(
                "--admin", help="admin API HOST:PORT, default 127.0.0.1:7878 (0: any port)"
            ),
        ],
    ),
    _shared(
        "policy",
        Annotated[
            str | None,
            typer.Option("--policy", help="eviction policy: sieve (default), arc, lru, s3fifo"),
        ],
    ),
    _shared(
        "miss_deadline",
        Annotated[
            float | None,
            typer.Option(
                "--miss-deadline", help="seconds a miss may wait for the hub (60), then EIO"
            ),
        ],
    ),
    _shared("admin_token_file", TokenOpt),
    _shared("hub_ca", HubCaOpt),
    _shared("hub_server_name", HubNameOpt),
    _shared("hub_cert", HubCertOpt),
    _shared("hub_key", HubKeyOpt),
    _shared("hub_token_file", HubTokenOpt),
    _shared("hub_tls", HubTlsOpt),
    _shared("hub_insecure", HubInsecureOpt),
    _shared("no_admin_token", NoAdminTokenOpt),
    _shared("audit_log", AuditLogOpt),
    _shared("audit_max_bytes", AuditMaxBytesOpt),
    _shared("audit_backups", AuditBackupsOpt),
    _shared("retention", RetentionOpt),
    _shared("encryption_key_file", EncryptionKeyOpt),
    _shared("publisher_key", PublisherKeyOpt),
    _shared("background_fill", FillOpt),
    _shared("fill_rate", FillRateOpt),
    _shared("peer_listen", PeerListenOpt),
    _shared("peer_advertise", PeerAdvertiseOpt),
    _shared("peers", PeersOpt),
    _shared("peers_dns", PeersDnsOpt),
    _shared("peer_token_file", PeerTokenOpt),
    _shared("peer_cert", PeerCertOpt),
    _shared("peer_key", PeerKeyOpt),
    _shared("peer_ca", PeerCaOpt),
    _shared("peer_server_name", PeerServerNameOpt),
    _shared("peer_insecure", PeerInsecureOpt),
    _shared("peer_grant_key", PeerGrantKeyOpt),
    _shared("peer_timeout", PeerTimeoutOpt, 2.0),
    _shared("peer_max_connections", PeerMaxConnectionsOpt, 1024),
    _shared("log_level", LogOpt, "INFO"),
)

_Command = TypeVar("_Command", bound=Callable[..., None])


def _with_options(*own: inspect.Parameter) -> Callable[[_Command], _Command]:
    """Give a command taking ``**options`` the parameters ``own`` + :data:`SPOKE_OPTIONS`
    (typer reads a function's ``__signature__``), so ``run`` and ``daemon`` list them once."""

    def wrap(command: _Command) -> _Command:
        setattr(command, "__signature__", inspect.Signature([*own, *SPOKE_OPTIONS]))  # noqa: B010
        return command

    return wrap


@app.command()
@_with_options(
    _shared(
        "mount",
        Annotated[Path | None, typer.Option("--mount", help="mountpoint (an existing directory)")],
    ),
    _shared(
        "allow_other",
        Annotated[
            bool | None, typer.Option("--allow-other", help="let other users read the mount")
        ],
    ),
    _shared(
        "read_ahead_kb",
        Annotated[
            int | None, typer.Option("--read-ahead-kb", help="kernel readahead of the mount, KiB")
        ],
    ),
    _shared(
        "passthrough",
        Annotated[
            str | None,
            typer.Option(
                "--passthrough", help="auto (default): the kernel reads cached one-block files; off"
            ),
        ],
    ),
    _shared("config", ConfigOpt),
)
def run(**options: Any) -> None:
    """Start the spoke daemon and its mount; stop both on SIGINT/SIGTERM.

    SIGHUP upgrades in place (new supervisor and daemon code; the mount process and its
    open files stay); SIGUSR1 exits leaving both serving for the next ``run`` to adopt.
    """
    settings = _configure("strata-spoke", _with_mesh(options))
    try:
        code = Supervisor(settings, options["log_level"]).run()
    except StartupError as err:
        _fail(str(err), 1)
    raise typer.Exit(code)


@app.command(hidden=True)
@_with_options(
    _shared(
        "mount",
        Annotated[
            Path | None, typer.Option("--mount", help="the mount /readyz reports on (resolved)")
        ],
    ),
)
def daemon(**options: Any) -> None:
    """Run only the daemon (``run`` starts it for you)."""
    settings = _configure("strata-spoke-daemon", _with_mesh(options))
    from spoke.disk.encryption import EncryptionError
    from spoke.disk.hardening import UnsafeDirectory
    from spoke.run.daemon import run_daemon  # grpc.aio and uvicorn only in this process
    from spoke.run.lock import CacheInUse
    from spoke.serve.limits import limit_malloc_arenas

    limit_malloc_arenas()  # before gRPC starts its threads (spoke/serve/limits.py)

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
