"""A read-only HTTP/1.1 file server with byte ranges: the source for rclone, httpdirfs, copies.

    python -m bench.http_source --root DIR [--listen 127.0.0.1:0] [--port-file FILE]

The standard library's ``http.server`` speaks HTTP/1.0 (a new connection per request)
and ignores ``Range``; the remote-filesystem tools read files in ranges over kept-alive
connections, as they would from a web server or object store, so this server adds both:
``GET``/``HEAD`` with a single ``Range: bytes=A-B`` (RFC 9110 §14) answered ``206``, an
HTML directory listing for every directory (links ending in ``/`` are directories, which
is what rclone's ``http`` backend and httpdirfs parse), keep-alive, one thread per
connection, and ``sendfile(2)`` for the bytes.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import signal
import socket
import sys
import threading
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO

from protocol.address import parse_hostport
from strata_local.atomic import write_atomic

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class RangeRequestHandler(SimpleHTTPRequestHandler):
    """``SimpleHTTPRequestHandler`` with HTTP/1.1 keep-alive and single byte ranges."""

    protocol_version = "HTTP/1.1"
    _range: tuple[int, int] | None = None  # (first, last) byte of the answer, inclusive

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: a benchmark run makes thousands of requests."""

    def send_head(self) -> Any:
        """Headers for ``GET``/``HEAD``; a ``Range`` on a file gets ``206`` or ``416``."""
        self._range = None
        path = self.translate_path(self.path)
        header = self.headers.get("Range")
        if header is None or os.path.isdir(path):
            return super().send_head()
        match = _RANGE.match(header.strip())
        try:
            f = open(path, "rb")  # noqa: SIM115 (returned to the caller, as in the base class)
        except OSError:
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        size = os.fstat(f.fileno()).st_size
        first, last = _parse_range(match, size)
        if first > last:
            f.close()
            self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        self._range = (first, last)
        self.send_response(HTTPStatus.PARTIAL_CONTENT)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        self.send_header("Content-Length", str(last - first + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return f

    def end_headers(self) -> None:
        """Announce range support on every answer."""
        if self._range is None:
            self.send_header("Accept-Ranges", "bytes")
        super().end_headers()

    def copyfile(self, source: BinaryIO, outputfile: Any) -> None:  # type: ignore[override]
        """Send the file, or its requested range, with ``sendfile(2)`` where possible."""
        first, count = 0, None
        if self._range is not None:
            first, count = self._range[0], self._range[1] - self._range[0] + 1
        if isinstance(source, io.BytesIO):  # a directory listing
            shutil.copyfileobj(source, outputfile)
            return
        self.wfile.flush()
        self.connection.sendfile(source, first, count)


def _parse_range(match: re.Match[str] | None, size: int) -> tuple[int, int]:
    """``(first, last)`` inclusive for a parsed ``Range``; first > last if unsatisfiable."""
    if match is None or (not match.group(1) and not match.group(2)):
        return 0, size - 1  # unparseable ranges are ignored: the whole file (RFC 9110)
    if not match.group(1):  # suffix range: the last N bytes
        n = int(match.group(2))
        return max(0, size - n), size - 1 if n else -1
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) else size - 1
    return first, min(last, size - 1)


class FileServer(ThreadingHTTPServer):
    """A threaded HTTP server of one directory tree."""

    daemon_threads = True

    def __init__(self, root: Path, listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.root = root

        def handler(*args: Any) -> RangeRequestHandler:
            return RangeRequestHandler(*args, directory=str(root))

        super().__init__(listen, handler)

    def server_bind(self) -> None:
        """Bind without the reverse DNS lookup of ``HTTPServer.server_bind``."""
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(self.server_address)
        self.server_address = self.socket.getsockname()[:2]
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


def main(argv: list[str] | None = None) -> int:
    """Serve ``--root`` until SIGINT/SIGTERM; writes the port to ``--port-file``."""
    parser = argparse.ArgumentParser(prog="python -m bench.http_source", description=__doc__)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT")
    parser.add_argument("--port-file", type=Path, default=None)
    ns = parser.parse_args(argv)
    server = FileServer(ns.root, parse_hostport(ns.listen, default_host="127.0.0.1"))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    if ns.port_file is not None:
        write_atomic(ns.port_file, f"{server.server_port}\n".encode())
    stop.wait()
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
