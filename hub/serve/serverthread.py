"""A hub server on its own event loop in a thread (:class:`ServerThread`), for synchronous
callers: tests, benchmarks, the demo. What it runs is :class:`hub.serve.server.HubServer`."""

from __future__ import annotations

import asyncio
import os
import threading
from types import TracebackType

from hub.serve.address import Address
from hub.serve.config import ServerConfig
from hub.serve.metrics import HubMetrics
from hub.serve.server import HubServer


class ServerThread:
    """A hub server on its own event loop in a daemon thread, for synchronous callers.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.

    Args:
        data_dir: An existing data directory.
        listen: ``HOST:PORT``; port 0 (the default, on 127.0.0.1) picks a free port.
        metrics: Counters to update; a fresh set by default.
        grace: Seconds calls in flight get to finish when stopping.
        config: TLS, tokens, limits and the blob store; defaults otherwise.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        listen: str = "127.0.0.1:0",
        *,
        metrics: HubMetrics | None = None,
        grace: float = 1.0,
        config: ServerConfig | None = None,
    ) -> None:
        self._data_dir = data_dir
        self._listen = listen
        self._metrics = metrics
        self._grace = grace
        self._config = config
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
        loop = self._loop
        if loop is not None and not loop.is_closed() and self._stop_requested is not None:
            loop.call_soon_threadsafe(self._stop_requested.set)
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
                self._data_dir, self._listen, metrics=self._metrics, config=self._config
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
