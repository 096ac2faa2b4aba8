"""Copy-first: download a whole directory tree over HTTP before reading any of it.

    python -m bench.copy_first URL DEST [--parallel 8] [--json FILE]

What people do today when the data is in another region: copy it all, then train. The
tree is discovered by crawling the server's HTML directory listings (links ending in
``/`` are directories), level by level, and the files are fetched with ``--parallel``
kept-alive HTTP/1.1 connections, as ``rclone copy`` or ``aws s3 cp --recursive`` would.
Prints (or writes) JSON: files, bytes, seconds, and when each file finished.
"""

from __future__ import annotations

import argparse
import http.client
import json
import queue
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

READ_BYTES = 1 << 20


class CopyError(RuntimeError):
    """A listing or a download failed; the message names the URL."""


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            href = dict(attrs).get("href")
            if href and not href.startswith(("?", "#", "/", "..")) and "://" not in href:
                self.links.append(href)


@dataclass
class CopyResult:
    """What a copy did.

    Attributes:
        files: Files downloaded.
        bytes: Bytes of file content downloaded.
        seconds: Wall time from the first listing to the last byte on disk.
        finished: ``(seconds since start, bytes done)`` after each file.
    """

    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    finished: list[tuple[float, int]] = field(default_factory=list)


class _Client:
    """One kept-alive connection (reconnects when the server closes it)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.conn = http.client.HTTPConnection(host, port, timeout=120)

    def get(self, path: str) -> http.client.HTTPResponse:
        try:
            self.conn.request("GET", path)
            return self.conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionError):  # closed while idle: retry
            self.conn.close()
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
            self.conn.request("GET", path)
            return self.conn.getresponse()

    def close(self) -> None:
        self.conn.close()


def copy_tree(url: str, dest: Path, parallel: int = 8) -> CopyResult:
    """Download everything under ``url`` (a directory URL) into ``dest``.

    Raises:
        CopyError: A request failed or answered other than 200.
    """
    parts = urllib.parse.urlsplit(url if url.endswith("/") else url + "/")
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    base = parts.path
    result = CopyResult()
    started = time.monotonic()
    lock = threading.Lock()
    work: queue.Queue[tuple[str, str] | None] = queue.Queue()  # (kind, path): dir or file
    pending = [0]
    errors: list[str] = []

    def worker() -> None:
        client = _Client(host, port)
        try:
            while (item := work.get()) is not None:
                kind, path = item
                try:
                    if kind == "dir":
                        for link in _list(client, path):
                            with lock:
                                pending[0] += 1
                            work.put(("dir" if link.endswith("/") else "file", path + link))
                    else:
                        n = _fetch(client, path, dest / urllib.parse.unquote(path[len(base) :]))
                        with lock:
                            result.files += 1
                            result.bytes += n
                            result.finished.append((time.monotonic() - started, result.bytes))
                except (CopyError, OSError, http.client.HTTPException) as err:
                    with lock:
                        errors.append(f"{path}: {err}")
                finally:
                    with lock:
                        pending[0] -= 1
                        if pending[0] == 0:
                            for _ in range(parallel):
                                work.put(None)
        finally:
            client.close()

    pending[0] = 1
    work.put(("dir", base))
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.seconds = time.monotonic() - started
    if errors:
        raise CopyError(f"{len(errors)} failed, e.g. {errors[0]}")
    return result


def _list(client: _Client, path: str) -> list[str]:
    reply = client.get(path)
    body = reply.read()
    if reply.status != 200:
        raise CopyError(f"listing answered {reply.status}")
    parser = _Links()
    parser.feed(body.decode("utf-8", "replace"))
    return parser.links


def _fetch(client: _Client, path: str, out: Path) -> int:
    reply = client.get(path)
    if reply.status != 200:
        reply.read()
        raise CopyError(f"answered {reply.status}")
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with out.open("wb") as fh:
        while chunk := reply.read(READ_BYTES):
            fh.write(chunk)
            n += len(chunk)
    return n


def main(argv: list[str] | None = None) -> int:
    """Entry point: copy, then print the result as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.copy_first", description=__doc__)
    parser.add_argument("url")
    parser.add_argument("dest", type=Path)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    ns = parser.parse_args(argv)
    try:
        result = copy_tree(ns.url, ns.dest, ns.parallel)
    except CopyError as err:
        print(f"copy_first: error: {err}", file=sys.stderr)
        return 1
    record: dict[str, Any] = {
        "files": result.files,
        "bytes": result.bytes,
        "seconds": result.seconds,
        "finished": result.finished,
    }
    text = json.dumps(record)
    if ns.json:
        ns.json.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
