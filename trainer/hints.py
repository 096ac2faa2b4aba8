"""Opt-in prefetch hints: tell a cache service which chunk files an epoch will read, in order.

With ``strata-train fit --hints URL``, every rank posts each upcoming epoch's planned read
order of its own shard (:func:`trainer.readorder.epoch_read_order`: store-relative chunk keys
such as ``amplitude/c/0/0/1``) as paths relative to the snapshot root, as a stream of its
own (``<stream>.rank<N>``), so a cache can prefetch them and evict by farthest next use, as
NoPFS does from the shuffle seed (Dryden et al., "Clairvoyant Prefetching for Distributed
Machine Learning I/O", SC 2021). When the run ends each rank deletes its stream. It is
plain JSON over HTTP: the trainer still only knows a path, and a failed post never stops
training.

Posting never holds training up: :meth:`HintPoster.post_later` hands a post to the
poster's own thread (posts leave one at a time, in the order they were handed over, each
computing its keys there), so the run builds its model and starts its DataLoader while the
first posts are on their way, and its first read does not wait for any of them. A run
posts the first few steps' keys of an epoch on their own first (:func:`split_head`), so the
cache starts fetching what the first batches read while the rest of the plan is still
being computed and posted.
"""

from __future__ import annotations

import hashlib
import queue
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath

import httpx

from trainer.location import is_url, url_parts

_STREAM_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,50}$")  # leaves room for ".rankN"

CLOSE_WAIT_S = 30.0
"""How long :meth:`HintPoster.close` waits for posts still queued or on their way."""

Keys = Sequence[str] | Callable[[], Sequence[str]]
"""A post's keys, or what computes them (called on the poster's thread)."""


def default_stream(out: Path) -> str:
    """The stream name of a run writing to ``out``: ``fit-`` and 8 hex digits of its
    resolved path, so a resumed run replaces its own streams and two runs never share."""
    return "fit-" + hashlib.sha256(str(Path(out).resolve()).encode()).hexdigest()[:8]


def check_stream(name: str) -> str:
    """``name`` if it is a valid stream base name, else ValueError saying what is allowed."""
    if not _STREAM_NAME.match(name):
        raise ValueError(
            f"hint stream {name!r}: use 1-51 characters a-z 0-9 . _ - starting with a "
            "letter or digit"
        )
    return name


@dataclass(frozen=True)
class HintTarget:
    """Where hints go and how the data path maps to the service's names.

    Attributes:
        url: base URL of the service's admin API (``POST {url}/v1/hints``).
        dataset, ref: the dataset and version/tag the data path is a snapshot of.
        prefix: the store's path relative to the snapshot root (e.g. ``f3.mdio``).
        token: bearer token, or None.
        stream: base name of the run's streams (rank N posts as ``<stream>.rankN``);
            None: :func:`default_stream` of the run's output directory.
    """

    url: str
    dataset: str
    ref: str
    prefix: str
    token: str | None = None
    stream: str | None = None

    @classmethod
    def for_path(
        cls,
        url: str,
        data: str | Path,
        dataset: str | None = None,
        ref: str | None = None,
        prefix: str | None = None,
        token_file: Path | None = None,
        stream: str | None = None,
    ) -> HintTarget:
        """Defaults read off a ``MOUNT/<dataset>/<ref>/<store>`` path, each overridable.

        A URL (``s3://bucket/<dataset>/<ref>/<store>``) is read the same way, off its
        bucket and key.

        Raises:
            OSError: the token file cannot be read.
            ValueError: ``stream`` is not a valid name.
        """
        path: PurePath = url_parts(data) if is_url(data) else Path(data)
        token = token_file.read_text().strip() if token_file is not None else None
        return cls(
            url=url.rstrip("/"),
            dataset=dataset or path.parent.parent.name,
            ref=ref or path.parent.name,
            prefix=(prefix if prefix is not None else path.name).strip("/"),
            token=token,
            stream=check_stream(stream) if stream is not None else None,
        )


def split_head(keys: Sequence[str], head: Sequence[str]) -> tuple[list[str], list[str]]:
    """``keys`` (an epoch's first touches, in order) as the part ``head`` (the first touches
    of its first steps) already names, and the rest.

    The first touches of a prefix of the reads are a prefix of the first touches of all of
    them, so the two parts, posted in turn, plan exactly ``keys``.

    Raises:
        ValueError: ``head`` is not a prefix of ``keys``.
    """
    if list(keys[: len(head)]) != list(head):
        raise ValueError("the first steps' keys are not a prefix of the epoch's")
    return list(head), list(keys[len(head) :])


class HintPoster:
    """Posts one rank's read orders as its stream; failures are reported through ``echo``
    and otherwise ignored.

    :meth:`post` posts at once; :meth:`post_later` queues a post for the poster's
    thread (started on first use), which sends them one at a time, in order.

    Args:
        target: where to post.
        stream: this rank's stream name (e.g. ``fit-1a2b3c4d.rank0``).
        echo: where problems are reported.
    """

    def __init__(
        self, target: HintTarget, stream: str, echo: Callable[[str], None] = print
    ) -> None:
        self.target = target
        self.stream = stream
        self.echo = echo
        headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
        self._client = httpx.Client(base_url=target.url, headers=headers, timeout=30.0)
        self.posted = 0
        self._queue: queue.Queue[tuple[Keys, bool] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closing = False

    def post_later(self, keys: Keys, append: bool) -> None:
        """Queue a post of ``keys`` (or of what ``keys()`` returns, computed on the
        poster's thread) and return at once; posts leave in the order queued."""
        if self._closing:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hint-poster", daemon=True)
            self._thread.start()
        self._queue.put((keys, append))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            keys, append = item
            try:
                try:
                    paths = keys() if callable(keys) else keys
                except Exception as exc:  # a plan that cannot be computed is not posted
                    self.echo(f"hints: read order not computed ({exc}); training goes on")
                    continue
                if paths:
                    self.post(paths, append)
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def wait(self) -> None:
        """Block until every queued post has been sent (or given up)."""
        if self._thread is not None:
            self._queue.join()

    def post(self, keys: Sequence[str], append: bool) -> bool:
        """Post one epoch's keys in read order; True when the service accepted them."""
        prefix = f"{self.target.prefix}/" if self.target.prefix else ""
        body = {
            "dataset": self.target.dataset,
            "ref": self.target.ref,
            "paths": [prefix + k for k in keys],
            "append": append,
            "stream": self.stream,
        }
        try:
            reply = self._client.post("/v1/hints", json=body)
        except httpx.HTTPError as exc:
            self.echo(f"hints: not posted ({exc}); training goes on")
            return False
        if not reply.is_success:
            self.echo(f"hints: {reply.status_code} {reply.text[:200]}; training goes on")
            return False
        self.posted += 1
        return True

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop taking posts, let the queued ones go out (for up to ``wait_s`` seconds
        in all), delete the stream if anything was posted (the plan ends with the run),
        then close the HTTP client."""
        self._closing = True
        thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(wait_s)
            if thread.is_alive():
                self.echo(f"hints: posts still running after {wait_s:.0f} s; not waiting")
                return  # its client is still in use; the process is ending anyway
        try:
            if self.posted:
                reply = self._client.delete(f"/v1/hints/{self.stream}")
                if not reply.is_success and reply.status_code != 404:
                    self.echo(f"hints: stream not deleted ({reply.status_code})")
        except httpx.HTTPError as exc:
            self.echo(f"hints: stream not deleted ({exc})")
        finally:
            self._client.close()
