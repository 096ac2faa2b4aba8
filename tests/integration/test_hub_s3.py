"""The blob store interface against both backends, and a hub whose blocks live in S3.

The S3 side runs against two S3-compatible servers the tests start on 127.0.0.1: moto
in server mode (quick, but it accepts any credentials) and SeaweedFS, a real object
store that enforces them (tests/integration/seaweedfs.py).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hub.catalog import Catalog
from hub.cli.main import main
from hub.errors import BlockNotFound, ConfigError, CorruptBlob, InvalidDigest, StorageError
from hub.publish.tree import publish
from hub.serve.config import ServerConfig
from hub.serve.serverthread import ServerThread
from hub.snapshot.blocks import block_digest
from hub.store.blobstore import BlobStore, LocalBlobStore, open_blob_store
from hub.store.gc import collect
from hub.store.s3blobs import S3BlobStore
from hub.store.verify import verify
from protocol.hub.v1 import hub_pb2_grpc
from tests.integration.hub_support import (
    S3_ENV,
    S3Server,
    manifest,
    read_all,
    s3_server_fixture,  # noqa: F401  (the s3_server fixture: moto)
    write_tree,
)
from tests.integration.seaweedfs import seaweedfs_fixture  # noqa: F401  (seaweedfs)

_buckets = itertools.count()


def _s3(request: pytest.FixtureRequest, backend: str, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    for key, value in S3_ENV.items():  # the credentials both servers know
        monkeypatch.setenv(key, value)
    server: S3Server = request.getfixturevalue(
        {"moto": "s3_server", "seaweedfs": "seaweedfs"}[backend]
    )
    return server


@pytest.fixture(params=["moto", "seaweedfs"])
def s3(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """An S3-compatible server: moto, then SeaweedFS."""
    return _s3(request, request.param, monkeypatch)


@pytest.fixture
def bucket(s3: S3Server) -> str:
    return s3.bucket(f"strata-{os.getpid()}-{next(_buckets)}")


@pytest.fixture(params=["local", "moto", "seaweedfs"])
def store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[BlobStore]:
    if request.param == "local":
        yield LocalBlobStore(tmp_path / "blobs")
    else:
        server = _s3(request, request.param, monkeypatch)
        url = server.bucket(f"contract-{os.getpid()}-{next(_buckets)}")
        yield S3BlobStore(url, endpoint_url=server.endpoint)


def test_blob_store_contract(store: BlobStore) -> None:
    data = os.urandom(1000)
    digest = block_digest(data)
    assert not store.exists(digest)
    assert store.put(digest, data) is True
    assert store.put(digest, data) is False, "a second put of a stored blob is a no-op"
    assert store.exists(digest)
    assert store.size(digest) == 1000
    assert store.read(digest) == data
    assert store.read(digest, 10, 20) == data[10:30]
    assert store.read(digest, 990, 100) == data[990:]
    assert store.read(digest, 5, 0) == b""
    other = block_digest(b"other")
    store.put(other, b"other")
    assert sorted(store.iter_digests()) == sorted([digest, other])
    store.sync()
    store.delete([digest, block_digest(b"never stored")])
    assert list(store.iter_digests()) == [other]
    with pytest.raises(BlockNotFound):
        store.read(digest)
    with pytest.raises(BlockNotFound):
        store.size(digest)
    with pytest.raises(CorruptBlob):
        store.put(block_digest(b"x"), b"y")
    with pytest.raises(InvalidDigest):
        store.exists("../../etc/passwd")
    assert store.clean_temp(0) == 0


@pytest.mark.parametrize("url", ["s3://", "s3:///x", "s3://b/../c", "gs://bucket/x"])
def test_bad_store_urls(url: str) -> None:
    with pytest.raises(ConfigError):
        open_blob_store(url)


def test_a_hub_on_s3(tmp_path: Path, s3: S3Server, bucket: str) -> None:
    data = tmp_path / "data"
    files = {"same.bin": os.urandom(5000), "edit.bin": os.urandom(3000)}
    src = write_tree(tmp_path / "src", files)
    first = publish(data, "f3", src, block_size=1024, blobs=bucket, s3_endpoint=s3.endpoint)
    assert (first.new_blocks, first.new_bytes) == (8, 8000)
    assert not (data / "blobs").exists(), "no block was written locally"
    (src / "edit.bin").write_bytes(os.urandom(3000))
    # The catalog remembers the store: no --blobs needed from now on.
    second = publish(data, "f3", src, block_size=1024, s3_endpoint=s3.endpoint)
    assert (second.new_blocks, second.new_bytes) == (3, 3000)
    config = ServerConfig(s3_endpoint=s3.endpoint)
    with (
        ServerThread(data, config=config) as server,
        grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        stub = hub_pb2_grpc.HubStub(channel)
        for name, entry in manifest(stub, "f3").items():
            blocks = read_all(stub, [block.digest for block in entry.blocks])
            content = b"".join(blocks[block.digest] for block in entry.blocks)
            assert content == (src / name).read_bytes()
    store = S3BlobStore(bucket, endpoint_url=s3.endpoint)
    with Catalog(data / "catalog") as catalog:
        catalog.revoke("f3", "v1")
        assert collect(catalog, store).blobs_deleted == 3
        assert verify(catalog, store, "f3", "v2", blocks=True).ok
    assert len(list(store.iter_digests())) == 8


def test_cli_with_s3(
    tmp_path: Path, s3: S3Server, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data, src = str(tmp_path / "data"), str(write_tree(tmp_path / "src", {"a": b"abc"}))
    endpoint = ["--s3-endpoint", s3.endpoint]
    assert main(["publish", "--data-dir", data, "f3", src, "--blobs", bucket, *endpoint]) == 0
    assert main(["verify", "--data-dir", data, "f3", "v1", "--blocks", *endpoint]) == 0
    assert capsys.readouterr().out.endswith("ok, 1 blocks\n")
    assert main(["gc", "--data-dir", data, *endpoint]) == 0
    assert "scanned 1 blobs, deleted 0" in capsys.readouterr().err
    assert main(["publish", "--data-dir", data, "f3", src, "--blobs", "elsewhere"]) == 2
    assert "keeps its blocks in s3://" in capsys.readouterr().err


def test_seaweedfs_refuses_wrong_credentials(
    tmp_path: Path,
    seaweedfs: S3Server,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A real object store checks signatures (moto does not): a wrong secret or an unknown
    key is a clear StorageError and a one-line CLI error, and nothing is written."""
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    url = seaweedfs.bucket(f"guarded-{os.getpid()}-{next(_buckets)}")
    good = S3BlobStore(url, endpoint_url=seaweedfs.endpoint)
    data = b"guarded block"
    good.put(block_digest(data), data)
    for key, value in (("AWS_SECRET_ACCESS_KEY", "wrong-secret"), ("AWS_ACCESS_KEY_ID", "nobody")):
        monkeypatch.setenv(key, value)
        bad = S3BlobStore(url, endpoint_url=seaweedfs.endpoint)
        with pytest.raises(StorageError, match=re.escape(url)):
            bad.read(block_digest(data))
        with pytest.raises(StorageError, match=re.escape(url)):
            bad.put(block_digest(b"intruder"), b"intruder")
        with pytest.raises(StorageError, match=re.escape(url)):
            list(bad.iter_digests())
        src = write_tree(tmp_path / f"src-{key}", {"a": b"abc"})
        data_dir = str(tmp_path / f"data-{key}")
        args = ["publish", "--data-dir", data_dir, "f3", str(src), "--blobs", url]
        assert main([*args, "--s3-endpoint", seaweedfs.endpoint]) == 1
        err = capsys.readouterr().err
        assert err.startswith("strata-hub: error:") and err.count("\n") == 1, err
        monkeypatch.setenv(key, S3_ENV[key])
    assert list(good.iter_digests()) == [block_digest(data)], "nothing else was written"
