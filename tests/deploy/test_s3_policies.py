"""deploy/s3's bucket policies, enforced by moto's IAM simulation (a moto server of this
test's own, in a subprocess, authorizing every request against the policies of the key
that signed it): with the serve key the hub reads blocks (HEAD, ranged GET, listing) and
``strata-hub verify --blocks`` passes, while a publish and a deletion are refused; with
the publish key publishing and deleting work; neither key reaches another prefix.

moto authorizes a single DeleteObject by the caller's policies but a multi-object
DeleteObjects (what gc sends) only by a bucket policy, so the deletion is checked with
DeleteObject here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import botocore.exceptions
import pytest
import requests

from deploy.local import free_port
from hub.errors import StorageError
from hub.snapshot.blocks import block_digest
from hub.store.s3blobs import S3BlobStore
from tests.conftest import REPO_ROOT
from tests.support import eventually

POLICIES = REPO_ROOT / "deploy" / "s3"
BUCKET, PREFIX = "strata-blobs", "blobs"
DUMMY = {"AWS_ACCESS_KEY_ID": "setup", "AWS_SECRET_ACCESS_KEY": "setup"}


def policy(role: str) -> dict[str, object]:
    document: dict[str, object] = json.loads((POLICIES / f"{role}-policy.json").read_text())
    return document


def test_policies_name_the_bucket_and_what_each_may_do() -> None:
    actions = {}
    for role in ("serve", "publish"):
        statements = policy(role)["Statement"]
        assert isinstance(statements, list)
        for statement in statements:
            assert statement["Effect"] == "Allow"
            for resource in statement["Resource"]:
                assert resource in (f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/{PREFIX}/*")
        actions[role] = {a for s in statements for a in s["Action"]}
    assert actions["serve"] == {"s3:GetObject", "s3:ListBucket"}, "serve only reads"
    assert {"s3:PutObject", "s3:DeleteObject"} <= actions["publish"]


@pytest.fixture(scope="module")
def moto() -> Iterator[tuple[str, dict[str, tuple[str, str]]]]:
    """A moto server with the bucket, a user per policy and its key; IAM enforced."""
    port = free_port()
    env = {**os.environ, **DUMMY, "AWS_DEFAULT_REGION": "us-east-1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        eventually(lambda: _up(url), "moto answers", timeout=30)
        session = boto3.Session(
            aws_access_key_id="setup", aws_secret_access_key="setup", region_name="us-east-1"
        )
        session.client("s3", endpoint_url=url).create_bucket(Bucket=BUCKET)
        iam = session.client("iam", endpoint_url=url)
        keys = {}
        for role in ("serve", "publish"):
            iam.create_user(UserName=role)
            iam.put_user_policy(
                UserName=role, PolicyName=role, PolicyDocument=json.dumps(policy(role))
            )
            key = iam.create_access_key(UserName=role)["AccessKey"]
            keys[role] = (key["AccessKeyId"], key["SecretAccessKey"])
        requests.post(f"{url}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()
        yield url, keys
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _up(url: str) -> bool:
    try:
        return requests.get(f"{url}/moto-api/", timeout=2).ok
    except requests.RequestException:
        return False


def _env(keys: tuple[str, str]) -> dict[str, str]:
    return {
        **os.environ,
        "AWS_ACCESS_KEY_ID": keys[0],
        "AWS_SECRET_ACCESS_KEY": keys[1],
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def _store(
    monkeypatch: pytest.MonkeyPatch, url: str, keys: tuple[str, str], prefix: str = PREFIX
) -> S3BlobStore:
    for name, value in _env(keys).items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    return S3BlobStore(f"s3://{BUCKET}/{prefix}", endpoint_url=url)


def hub(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hub", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_serve_reads_and_publish_writes(
    moto: tuple[str, dict[str, tuple[str, str]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, keys = moto
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(300_000))
    data = tmp_path / "hub"
    s3 = ["--blobs", f"s3://{BUCKET}/{PREFIX}", "--s3-endpoint", url]
    publish = ["publish", "--data-dir", str(data), *s3, "--block-size", "65536", "f3", str(src)]
    done = hub(_env(keys["serve"]), *publish)
    assert done.returncode != 0 and "Access Denied" in done.stderr, done.stderr
    done = hub(_env(keys["publish"]), *publish)
    assert done.returncode == 0 and done.stdout.strip() == "v1", done.stderr
    # every block read back (HEAD and GET) with the serve key
    verify = ["verify", "--data-dir", str(data), *s3[2:], "--blocks", "f3", "v1"]
    done = hub(_env(keys["serve"]), *verify)
    assert done.returncode == 0, done.stderr

    reader = _store(monkeypatch, url, keys["serve"])
    digests = list(reader.iter_digests())
    assert len(digests) == 5
    assert reader.read(digests[0], 0, 16) and reader.size(digests[0]) > 0
    assert not reader.exists(block_digest(b"absent")), "a missing block is absent, not denied"
    with pytest.raises(StorageError, match="Access Denied"):
        reader.put(block_digest(b"new"), b"new")
    client = boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=keys["serve"][0],
        aws_secret_access_key=keys["serve"][1],
        region_name="us-east-1",
    )
    key = f"{PREFIX}/{digests[0][:2]}/{digests[0]}"
    with pytest.raises(botocore.exceptions.ClientError, match=r"AccessDenied|Access Denied"):
        client.delete_object(Bucket=BUCKET, Key=key)
    with pytest.raises(StorageError):
        _store(monkeypatch, url, keys["serve"], "elsewhere").exists(digests[0])

    writer = _store(monkeypatch, url, keys["publish"])
    assert writer.put(block_digest(b"new"), b"new")
    boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=keys["publish"][0],
        aws_secret_access_key=keys["publish"][1],
        region_name="us-east-1",
    ).delete_object(Bucket=BUCKET, Key=key)
    assert not writer.exists(digests[0])
    with pytest.raises(StorageError):
        _store(monkeypatch, url, keys["publish"], "elsewhere").exists(digests[1])
