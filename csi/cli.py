"""``strata-csi``: serve the CSI node plugin on a UNIX socket.

    strata-csi serve --endpoint unix:///csi/csi.sock --mount /mnt/strata/data \\
                     --node-id NODE --state-dir /csi/volumes [--pods-dir /var/lib/kubelet/pods]
                     --tenancy /etc/strata/tenancy.yaml [--audit-log FILE] [--metrics HOST:PORT]
                     [--hub HOST:PORT --hub-ca CA.pem --hub-cert CERT.pem --hub-key KEY.pem
                      [--hub-server-name NAME]]
    strata-csi probe --endpoint unix:///csi/csi.sock [--ready]     # a liveness check

The kubelet and the node-driver-registrar speak to it over ``--endpoint`` (``$CSI_ENDPOINT``
by CSI convention); it needs ``CAP_SYS_ADMIN`` for mount(2) and must see the spoke's mount
and the kubelet's pod directory with the same paths as the kubelet. ``--hub`` (to check a
volume's own token) takes the spoke's TLS flags and, in the DaemonSet, the spoke's files:
the shipped hub requires a client certificate.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import threading
from concurrent import futures
from pathlib import Path
from types import FrameType
from typing import Annotated

import grpc
import prometheus_client
import typer

from csi.hubscope import HubScope
from csi.hubtls import HubTls, HubTlsError
from csi.service import DRIVER_NAME, Identity, Node
from csi.targets import PODS_DIR, Targets
from csi.tenancy import Tenancy
from csi.volumes import Volumes
from protocol.csi.v1 import csi_pb2, csi_pb2_grpc
from strata_local.audit import AuditLog

log = logging.getLogger("csi")

app = typer.Typer(
    name="strata-csi",
    help="Strata's CSI node plugin: a snapshot version of a dataset as a read-only pod volume.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Strata's CSI node plugin."""


def _fail(message: str) -> typer.Exit:
    typer.echo(f"strata-csi: error: {message}", err=True)
    return typer.Exit(2)


def socket_path(endpoint: str) -> Path:
    """The socket file of a CSI endpoint, ``unix:///abs/path`` or ``/abs/path``.

    Raises:
        ValueError: not a UNIX socket endpoint with an absolute path.
    """
    path = endpoint.removeprefix("unix://")
    if not path.startswith("/"):
        raise ValueError(f"--endpoint must be unix:///ABSOLUTE/PATH, not {endpoint!r}")
    return Path(path)


def serve_socket(
    endpoint: Path,
    volumes: Volumes,
    node_id: str,
    tenancy: Tenancy,
    audit: AuditLog | None = None,
    driver_name: str = DRIVER_NAME,
    hub: HubScope | None = None,
) -> grpc.Server:
    """Start the Identity and Node services on the UNIX socket ``endpoint`` (0600; a stale
    socket file there is replaced) and return the running server.

    Raises:
        OSError: the socket's directory is missing or a non-socket file is in the way.
        RuntimeError: gRPC could not listen there.
    """
    if endpoint.exists() or endpoint.is_symlink():
        if not stat.S_ISSOCK(endpoint.lstat().st_mode):
            raise OSError(f"{endpoint} exists and is not a socket")
        endpoint.unlink()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="csi"))
    csi_pb2_grpc.add_IdentityServicer_to_server(Identity(volumes, driver_name), server)
    node = Node(volumes, node_id, tenancy, audit, hub)
    csi_pb2_grpc.add_NodeServicer_to_server(node, server)
    old = os.umask(0o177)
    try:
        if server.add_insecure_port(f"unix:{endpoint}") == 0:
            raise RuntimeError(f"cannot listen on {endpoint}")
        server.start()
    finally:
        os.umask(old)
    return server


def hub_tls_of(
    ca: Path | None,
    cert: Path | None,
    key: Path | None,
    server_name: str | None,
    system_roots: bool,
    insecure: bool,
) -> HubTls | None:
    """The TLS settings for the hub from the flags (files read and checked now); None for
    plaintext, which must be asked for, as volumes' tokens would cross it in clear.

    Raises:
        HubTlsError: a file is missing, malformed, expired or mismatched; flags that do not
            go together; plaintext without ``--hub-insecure``.
    """
    if ca is None and cert is None and not system_roots:
        if server_name is not None:
            raise HubTlsError("--hub-server-name needs TLS (--hub-ca)")
        if key is not None:
            raise HubTlsError("--hub-cert and --hub-key go together")
        if not insecure:
            raise HubTlsError(
                "--hub without TLS would send volumes' tokens in cleartext: give --hub-ca "
                "(and --hub-cert/--hub-key for a hub that requires client certificates), "
                "--hub-tls, or --hub-insecure on a trusted network"
            )
        return None
    tls = HubTls(ca, cert, key, server_name)
    tls.credentials()  # every file read and checked now, not at the first pod
    return tls


def _greet(scope: HubScope) -> None:
    """Say in the log, once, whether the hub lets this plugin through."""
    problem = scope.greet()
    if problem is None:
        log.info("hub %s answers (TLS: %s)", scope.address, _tls_words(scope.tls))
    else:
        log.error("volumes' own tokens cannot be checked until this is fixed: %s", problem)


def _tls_words(tls: HubTls | None) -> str:
    if tls is None:
        return "none"
    return "with client certificate" if tls.mutual else "without client certificate"


@app.command()
def serve(
    node_id: Annotated[
        str,
        typer.Option("--node-id", envvar="NODE_NAME", help="This node's name ($NODE_NAME)."),
    ],
    endpoint: Annotated[
        str,
        typer.Option("--endpoint", envvar="CSI_ENDPOINT", help="unix:///PATH the kubelet dials."),
    ] = "unix:///csi/csi.sock",
    mount: Annotated[
        Path, typer.Option("--mount", help="The spoke's mount, as this process sees it.")
    ] = Path("/mnt/strata/data"),
    state_dir: Annotated[
        Path,
        typer.Option("--state-dir", help="Where publications are recorded (a node directory)."),
    ] = Path("/csi/volumes"),
    pods_dir: Annotated[
        Path,
        typer.Option(
            "--pods-dir",
            help="The kubelet's pods directory (its --root-dir + /pods): the only place "
            "targets may be.",
        ),
    ] = PODS_DIR,
    tenancy: Annotated[
        Path | None,
        typer.Option(
            "--tenancy",
            help="YAML: namespace (or namespace/serviceaccount) -> dataset globs its pods "
            "may mount; re-read on change. Without it nothing is published. One tenant: "
            '\'"*": ["*"]\'.',
        ),
    ] = None,
    audit_log: Annotated[
        Path | None,
        typer.Option(
            "--audit-log", help="Publishes and refusals, JSON lines (STATE_DIR/audit.jsonl)."
        ),
    ] = None,
    hub: Annotated[
        str | None,
        typer.Option(
            "--hub",
            help="HOST:PORT of the hub, to check a volume's own token (its "
            "nodePublishSecretRef's 'token') against the dataset's scope.",
        ),
    ] = None,
    hub_ca: Annotated[
        Path | None,
        typer.Option("--hub-ca", help="PEM CA bundle the hub's certificate is from."),
    ] = None,
    hub_server_name: Annotated[
        str | None,
        typer.Option(
            "--hub-server-name", help="Name in the hub's certificate, if not the --hub host."
        ),
    ] = None,
    hub_cert: Annotated[
        Path | None,
        typer.Option(
            "--hub-cert",
            help="PEM client certificate for mutual TLS (the shipped hub requires one: the "
            "spoke's).",
        ),
    ] = None,
    hub_key: Annotated[
        Path | None, typer.Option("--hub-key", help="PEM private key of --hub-cert.")
    ] = None,
    hub_tls: Annotated[
        bool, typer.Option("--hub-tls", help="TLS to the hub with the system's CA roots.")
    ] = False,
    hub_insecure: Annotated[
        bool,
        typer.Option(
            "--hub-insecure",
            help="Send volumes' tokens to the hub without TLS (trusted networks only).",
        ),
    ] = False,
    metrics: Annotated[
        str | None,
        typer.Option("--metrics", help="HOST:PORT for Prometheus metrics (none by default)."),
    ] = None,
    driver_name: Annotated[
        str, typer.Option("--driver-name", help="The CSIDriver's name.")
    ] = DRIVER_NAME,
    log_level: Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING …")] = "INFO",
) -> None:
    """Serve the CSI Identity and Node services until SIGTERM or SIGINT."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    try:
        path = socket_path(endpoint)
        volumes = Volumes(mount, state_dir, Targets(pods_dir))
        policy = Tenancy(tenancy)
        if not policy.policy:
            log.warning(
                "no tenancy policy (--tenancy %s): every publish is refused; one tenant: "
                '"*": ["*"]',
                tenancy,
            )
        audit = AuditLog(audit_log or state_dir / "audit.jsonl")
        if metrics is not None:
            host, _, port = metrics.rpartition(":")
            prometheus_client.start_http_server(int(port), addr=host or "127.0.0.1")
        scope = None
        if hub is not None:
            tls = hub_tls_of(hub_ca, hub_cert, hub_key, hub_server_name, hub_tls, hub_insecure)
            scope = HubScope(hub, tls)
        server = serve_socket(path, volumes, node_id, policy, audit, driver_name, scope)
    except (ValueError, OSError, RuntimeError) as err:
        raise _fail(str(err)) from None
    if scope is not None:
        threading.Thread(target=_greet, args=(scope,), name="hub-greet", daemon=True).start()

    def stop(signum: int, frame: FrameType | None) -> None:
        server.stop(grace=5)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("serving %s on %s for node %s (mount %s)", driver_name, path, node_id, mount)
    server.wait_for_termination()
    path.unlink(missing_ok=True)


@app.command()
def probe(
    endpoint: Annotated[
        str,
        typer.Option("--endpoint", envvar="CSI_ENDPOINT", help="unix:///PATH of the plugin."),
    ] = "unix:///csi/csi.sock",
    ready: Annotated[
        bool, typer.Option("--ready", help="Also require the spoke's mount to be up.")
    ] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait.")] = 5.0,
) -> None:
    """Ask the plugin's Probe (a container's liveness check): exit 0 when it answers (and,
    with --ready, says ready), 1 otherwise with the reason on stderr."""
    try:
        path = socket_path(endpoint)
    except ValueError as err:
        raise _fail(str(err)) from None
    with grpc.insecure_channel(f"unix:{path}") as channel:
        try:
            answer = csi_pb2_grpc.IdentityStub(channel).Probe(
                csi_pb2.ProbeRequest(), timeout=timeout
            )
        except grpc.RpcError as err:
            typer.echo(f"strata-csi: {path} does not answer: {err.code().name}", err=True)
            raise typer.Exit(1) from None
    if ready and answer.HasField("ready") and not answer.ready.value:
        typer.echo("strata-csi: not ready: the spoke's mount is not up", err=True)
        raise typer.Exit(1)


def main() -> None:
    """Entry point of ``strata-csi``."""
    app()
