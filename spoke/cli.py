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

from spoke.config import SpokeSettings
from spoke.mesh.settings import MeshSettings, split_peers
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
TokenOpt = Annotated[
    Path | None,
    typer.Option("--admin-token-file", help="file with the admin API's bearer token"),
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
PeerTimeoutOpt = Annotated[
    float, typer.Option("--peer-timeout", help="seconds a peer may take per block, then skipped")
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
    timeout: float,
) -> MeshSettings | None:
    """The mesh settings from the ``--peer*`` flags; None without ``--peer-listen``."""
    if listen is None:
        if peers or peers_dns or advertise or token_file or cert or key or ca:
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
            timeout=timeout,
        )
    except ValidationError as err:
        message = str(err.errors()[0]["msg"]).removeprefix("Value error, ")
        _fail(message if message.startswith("--") else f"--peer-*: {message}")


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


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _logging(level: str, who: str) -> None:
    if level.upper() not in LOG_LEVELS:
        _fail(f"--log-level: {level!r} is not one of {', '.join(LOG_LEVELS)}")
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
    admin_token_file: TokenOpt = None,
    background_fill: FillOpt = "off",
    fill_rate: FillRateOpt = None,
    peer_listen: PeerListenOpt = None,
    peer_advertise: PeerAdvertiseOpt = None,
    peers: PeersOpt = None,
    peers_dns: PeersDnsOpt = None,
    peer_token_file: PeerTokenOpt = None,
    peer_cert: PeerCertOpt = None,
    peer_key: PeerKeyOpt = None,
    peer_ca: PeerCaOpt = None,
    peer_timeout: PeerTimeoutOpt = 2.0,
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
        admin_token_file=admin_token_file,
        background_fill=background_fill,
        fill_rate=fill_rate,
        mesh=_mesh(
            peer_listen,
            peer_advertise,
            peers,
            peers_dns,
            peer_token_file,
            peer_cert,
            peer_key,
            peer_ca,
            peer_timeout,
        ),
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
    admin_token_file: TokenOpt = None,
    mount: Annotated[
        Path | None, typer.Option("--mount", help="the mount /readyz reports on (resolved)")
    ] = None,
    background_fill: FillOpt = "off",
    fill_rate: FillRateOpt = None,
    peer_listen: PeerListenOpt = None,
    peer_advertise: PeerAdvertiseOpt = None,
    peers: PeersOpt = None,
    peers_dns: PeersDnsOpt = None,
    peer_token_file: PeerTokenOpt = None,
    peer_cert: PeerCertOpt = None,
    peer_key: PeerKeyOpt = None,
    peer_ca: PeerCaOpt = None,
    peer_timeout: PeerTimeoutOpt = 2.0,
    log_level: LogOpt = "INFO",
) -> None:
    """Run only the daemon (``run`` starts it for you)."""
    from spoke.daemon import run_daemon  # grpc.aio and uvicorn only in this process
    from spoke.lock import CacheInUse

    settings = _settings(
        hub=hub,
        cache_dir=cache_dir,
        cache_size=cache_size,
        admin=admin,
        policy=policy,
        miss_deadline=miss_deadline,
        admin_token_file=admin_token_file,
        mount=mount,
        background_fill=background_fill,
        fill_rate=fill_rate,
        mesh=_mesh(
            peer_listen,
            peer_advertise,
            peers,
            peers_dns,
            peer_token_file,
            peer_cert,
            peer_key,
            peer_ca,
            peer_timeout,
        ),
    )
    _logging(log_level, "strata-spoke-daemon")
    try:
        asyncio.run(run_daemon(settings))
    except CacheInUse as err:
        _fail(f"daemon: {err.strerror}")
    except OSError as err:
        _fail(f"daemon: {err.strerror or err} ({admin})")


def _client(admin: str, token_file: Path | None) -> httpx.Client:
    url = admin if admin.startswith("http") else f"http://{admin}"
    headers = {}
    if token_file is not None:
        try:
            headers["Authorization"] = f"Bearer {token_file.read_text().strip()}"
        except OSError as err:
            _fail(f"--token-file {token_file}: {err.strerror}")
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
    str, typer.Option("--admin", help="admin API URL, e.g. http://127.0.0.1:7878")
]
TokenFileOpt = Annotated[
    Path | None, typer.Option("--token-file", help="file with the admin API's bearer token")
]


@app.command()
def prewarm(
    admin: AdminUrlOpt,
    target: Annotated[str, typer.Argument(help="DATASET or DATASET@REF (a version or tag)")],
    paths: Annotated[
        list[str] | None, typer.Argument(help="globs relative to the snapshot root")
    ] = None,
    pin: Annotated[bool, typer.Option("--pin", help="also pin what is prewarmed")] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="show progress until done; non-zero exit on failure")
    ] = False,
    token_file: TokenFileOpt = None,
) -> None:
    """Fetch a snapshot's files (all, or those matching GLOBs) into the spoke's cache."""
    dataset, at, ref = target.partition("@")
    if at and not ref:
        _fail(f"{target!r}: give a version or tag after '@', or leave '@' out for latest")
    body = {"dataset": dataset, "ref": ref or "latest", "paths": paths or [], "pin": pin}
    try:
        with _client(admin, token_file) as client:
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
def status(admin: AdminUrlOpt, token_file: TokenFileOpt = None) -> None:
    """Print the cache statistics of a running spoke as JSON."""
    try:
        with _client(admin, token_file) as client:
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


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
    sys.exit(0)
