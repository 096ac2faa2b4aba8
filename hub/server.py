"""Running the hub's gRPC server: on the caller's event loop, or on a background thread.

:func:`serve` (an alias of :meth:`HubServer.start`) is what the CLI uses;
:class:`ServerThread` runs the same server on its own event loop in a thread, so that
synchronous code (tests, demos) can start a hub and talk to it with a blocking client.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from types import TracebackType

import grpc

from hub.address import Address
from hub.blobstore import LocalBlobStore
from hub.blocks import MiB
from hub.catalog import Catalog
from hub.datadir import DataDir
from hub.errors import ListenError
from hub.metrics import HubMetrics
from hub.service import HubService
from protocol.hub.v1 import hub_pb2_grpc

MAX_MESSAGE_BYTES = 4 * MiB
"""Send and receive limit per gRPC message, bytes (gRPC's usual default receive limit).
Block data goes out in chunks of at most :data:`hub.service.CHUNK_BYTES`."""

GRACE_SECONDS = 5.0
"""How long :meth:`HubServer.stop` lets calls in flight finish, seconds."""

SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Without this a second server could bind the same port and steal half the calls.
    ("grpc.so_reuseport", 0),
)


def check_bindable(address: Address) -> None:
    """Tries to bind ``address`` with a plain socket, to report why gRPC would fail.

    gRPC's own bind failure gives no reason and logs to stderr from C++, so the server
    checks first. With port 0 only the host is checked (is it a local address?).

    Args:
        address: The address to check.

    Raises:
        ListenError: The host does not resolve, or an address it resolves to cannot be
            bound (in use, not a local address).
    """
    try:
        infos = socket.getaddrinfo(
            address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise ListenError(f"cannot listen on {address}: {exc.strerror}") from exc
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            # gRPC sets SO_REUSEADDR too, so a port in TIME_WAIT is not "in use".
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                raise ListenError(f"cannot listen on {address}: {exc.strerror}") from exc


class HubServer:
    """A started gRPC hub server over one data directory.

    Use :meth:`start`; stop with :meth:`stop`.

    Attributes:
        address: The bound address (the real port, never 0).
        data_dir: The data directory being served.
        metrics: The server's counters.
    """

    def __init__(
        self,
        server: grpc.aio.Server,
        catalog: Catalog,
        address: Address,
        data_dir: DataDir,
        metrics: HubMetrics,
    ) -> None:
        self._server = server
        self._catalog = catalog
        self.address = address
        self.data_dir = data_dir
        self.metrics = metrics

    @property
    def port(self) -> int:
        """The bound TCP port."""
        return self.address.port

    @classmethod
    async def start(
        cls,
        data_dir: str | os.PathLike[str],
        listen: str,
        *,
        metrics: HubMetrics | None = None,
    ) -> HubServer:
        """Opens the data directory, binds ``listen`` and starts serving.

        Args:
            data_dir: An existing data directory; its catalog and blob store are created
                when missing.
            listen: ``HOST:PORT``; port 0 picks a free port (see :attr:`port`).
            metrics: Counters to update; a fresh set by default.

        Returns:
            The running server.

        Raises:
            DataDirNotFound: ``data_dir`` does not exist or is not a directory.
            InvalidArgument: ``listen`` is malformed.
            ListenError: ``listen`` cannot be bound (in use, not a local address).
            CatalogError: The catalog cannot be opened.
        """
        address = Address.parse(listen)
        layout = DataDir.open(data_dir, create=False)
        check_bindable(address)
        metrics = metrics if metrics is not None else HubMetrics()
        catalog = Catalog(layout.catalog_path, create=True)
        try:
            store = LocalBlobStore(layout.blobs_path)
            server = grpc.aio.server(options=SERVER_OPTIONS)
            hub_pb2_grpc.add_HubServicer_to_server(HubService(catalog, store, metrics), server)
            try:
                port = server.add_insecure_port(str(address))
            except RuntimeError:
                port = 0
            if port == 0:
                await server.stop(None)
                raise ListenError(f"cannot listen on {listen}: address in use or not available")
            await server.start()
        except BaseException:
            catalog.close()
            raise
        return cls(server, catalog, Address(address.host, port), layout, metrics)

    async def stop(self, grace: float | None = GRACE_SECONDS) -> None:
        """Stops accepting calls, lets calls in flight finish for ``grace`` seconds, closes.

        Args:
            grace: Seconds to wait for calls in flight before cancelling them; None cancels
                them at once.
        """
        await self._server.stop(grace)
        self._catalog.close()

    async def wait_for_termination(self) -> None:
        """Waits until the server has stopped."""
        await self._server.wait_for_termination()


async def serve(
    data_dir: str | os.PathLike[str], listen: str, *, metrics: HubMetrics | None = None
) -> HubServer:
    """Starts a hub server on the running event loop; see :meth:`HubServer.start`.

    Args:
        data_dir: An existing data directory.
        listen: ``HOST:PORT``; port 0 picks a free port.
        metrics: Counters to update; a fresh set by default.

    Returns:
        The running server; ``port`` is the bound port, ``stop()`` stops it.
    """
    return await HubServer.start(data_dir, listen, metrics=metrics)


class ServerThread:
    """A hub server on its own event loop in a daemon thread, for synchronous callers.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.

    Args:
        data_dir: An existing data directory.
        listen: ``HOST:PORT``; port 0 (the default, on 127.0.0.1) picks a free port.
        metrics: Counters to update; a fresh set by default.
        grace: Seconds calls in flight get to finish when stopping.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        listen: str = "127.0.0.1:0",
        *,
        metrics: HubMetrics | None = None,
        grace: float = 1.0,
    ) -> None:
        self._data_dir = data_dir
        self._listen = listen
        self._metrics = metrics
        self._grace = grace
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None
        self._server: HubServer | None = None
        self._error: Exception | None = None

    @property
    def server(self) -> HubServer:
        """The running server.

        Raises:
            RuntimeError: The thread has not started the server.
        """
        if self._server is None:
            raise RuntimeError("the hub server thread is not running")
        return self._server

    @property
    def port(self) -> int:
        """The bound TCP port."""
        return self.server.port

    @property
    def address(self) -> Address:
        """The bound address."""
        return self.server.address

    def start(self) -> ServerThread:
        """Starts the thread and waits until the server is serving.

        Returns:
            This object.

        Raises:
            Exception: Whatever :meth:`HubServer.start` raised (e.g. ListenError).
        """
        self._thread = threading.Thread(target=self._run, name="strata-hub-server", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def stop(self) -> None:
        """Stops the server (with the grace period) and joins the thread. Idempotent."""
        if self._loop is not None and self._stop_requested is not None:
            self._loop.call_soon_threadsafe(self._stop_requested.set)
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._stop_requested = asyncio.Event()
        try:
            self._server = await HubServer.start(
                self._data_dir, self._listen, metrics=self._metrics
            )
        except Exception as exc:
            self._error = exc
            return
        finally:
            self._loop = asyncio.get_running_loop()
            self._started.set()
        try:
            await self._stop_requested.wait()
        finally:
            await self._server.stop(self._grace)
