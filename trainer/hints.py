"""Opt-in prefetch hints: tell a cache service which chunk files an epoch will read, in order.

With ``strata-train fit --hints URL``, rank 0 posts each upcoming epoch's planned read order
(:func:`trainer.dataset.epoch_read_order`: store-relative chunk keys such as
``amplitude/c/0/0/1``) as paths relative to the snapshot root, so a cache can prefetch them
and evict by farthest next use, as NoPFS does from the shuffle seed (Dryden et al.,
"Clairvoyant Prefetching for Distributed Machine Learning I/O", SC 2021). It is plain JSON
over HTTP: the trainer still only knows a path, and a failed post never stops training.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass(frozen=True)
class HintTarget:
    """Where hints go and how the data path maps to the service's names.

    Attributes:
        url: base URL of the service's admin API (``POST {url}/v1/hints``).
        dataset, ref: the dataset and version/tag the data path is a snapshot of.
        prefix: the store's path relative to the snapshot root (e.g. ``f3.mdio``).
        token: bearer token, or None.
    """

    url: str
    dataset: str
    ref: str
    prefix: str
    token: str | None = None

    @classmethod
    def for_path(
        cls,
        url: str,
        data: Path,
        dataset: str | None = None,
        ref: str | None = None,
        prefix: str | None = None,
        token_file: Path | None = None,
    ) -> HintTarget:
        """Defaults read off a ``MOUNT/<dataset>/<ref>/<store>`` path, each overridable.

        Raises:
            OSError: the token file cannot be read.
        """
        data = Path(data)
        token = token_file.read_text().strip() if token_file is not None else None
        return cls(
            url=url.rstrip("/"),
            dataset=dataset or data.parent.parent.name,
            ref=ref or data.parent.name,
            prefix=(prefix if prefix is not None else data.name).strip("/"),
            token=token,
        )


class HintPoster:
    """Posts read orders; failures are reported through ``echo`` and otherwise ignored."""

    def __init__(self, target: HintTarget, echo: Callable[[str], None] = print) -> None:
        self.target = target
        self.echo = echo
        headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
        self._client = httpx.Client(base_url=target.url, headers=headers, timeout=30.0)
        self.posted = 0

    def post(self, keys: Sequence[str], append: bool) -> bool:
        """Post one epoch's keys in read order; True when the service accepted them."""
        prefix = f"{self.target.prefix}/" if self.target.prefix else ""
        body = {
            "dataset": self.target.dataset,
            "ref": self.target.ref,
            "paths": [prefix + k for k in keys],
            "append": append,
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

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()
