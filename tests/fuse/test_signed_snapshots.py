"""Publisher signatures end to end: a spoke given ``--publisher-key`` serves a snapshot
published with ``--signing-key`` through its mount, and refuses (counted, logged, EIO in
the mount, 502 from the admin API) one published unsigned or signed by another key."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import httpx
import pytest

from deploy.local import LocalStack
from hub.auth.signing import keygen
from hub.publish.tree import publish
from tests.integration.hub_support import write_tree
from tests.support import requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse, pytest.mark.timeout(180)]


def test_only_snapshots_the_publisher_signed_are_served(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    keygen(tmp_path / "publisher.key", tmp_path / "publisher.pem")
    keygen(tmp_path / "intruder.key", tmp_path / "intruder.pem")
    data = tmp_path / "data"
    content = os.urandom(5 << 20)  # two blocks
    src = write_tree(tmp_path / "src", {"a.bin": content, "d/b.txt": b"hello"})
    publish(data, "signed", src, signing_key=tmp_path / "publisher.key")
    publish(data, "unsigned", src)
    publish(data, "forged", src, signing_key=tmp_path / "intruder.key")
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    with LocalStack() as stack:
        hub = stack.start_hub(data)
        flags = ("--publisher-key", str(tmp_path / "publisher.pem"), "--miss-deadline", "5")
        admin = stack.start_spoke(hub, cache, mnt, "64MiB", extra=flags, admin_token=True)
        assert (mnt / "signed" / "v1" / "a.bin").read_bytes() == content
        assert (mnt / "signed" / "latest" / "d" / "b.txt").read_bytes() == b"hello"
        for dataset in ("unsigned", "forged"):
            with pytest.raises(OSError) as caught:
                (mnt / dataset / "v1" / "a.bin").read_bytes()
            assert caught.value.errno == errno.EIO, dataset
        token = (cache / "admin.token").read_text().strip()
        reply = httpx.post(
            f"{admin}/v1/prewarm",
            json={"dataset": "unsigned"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert reply.status_code == 502
        assert "refused: it is not signed" in reply.json()["detail"]
        metrics = httpx.get(
            f"{admin}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10
        ).text
        refusals = next(
            float(line.split()[1])
            for line in metrics.splitlines()
            if line.startswith("strata_spoke_signature_refusals_total ")
        )
        assert refusals >= 3  # the two mount lookups and the prewarm
        stats = httpx.get(
            f"{admin}/v1/cache", headers={"Authorization": f"Bearer {token}"}, timeout=10
        ).json()
        assert set(stats["datasets"]) == {"signed"}  # nothing of the others was fetched
    err = capfd.readouterr().err
    assert "of forged v1 refused: its signature does not verify with the publisher key" in err
    assert "of unsigned v1 refused: it is not signed" in err
