"""The blob store interface against both backends, and a hub whose blocks live in S3.

The S3 side runs against a real S3-compatible server (moto in server mode) that the
tests start on 127.0.0.1 with port 0.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hub.blobstore import BlobStore, LocalBlobStore, S3BlobStore, open_blob_store
from hub.blocks import block_digest
from hub.catalog import Catalog
from hub.cli import main
from hub.errors import BlockNotFound, ConfigError, CorruptBlob, InvalidDigest
from hub.gc import collect
from hub.publish import publish
from hub.server import ServerConfig, ServerThread
from hub.verify import verify
from protocol.hub.v1 import hub_pb2_grpc
from tests.integration.hub_support import (
    S3Server,
    manifest,
    read_all,
    s3_server_fixture,  # noqa: F401  (the s3_server fixture)
    write_tree,
)

_buckets = itertools.count()


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    return s3_server.bucket(f"strata-{os.getpid()}-{next(_buckets)}")


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    if request.param == "local":
        yield LocalBlobStore(tmp_path / "blobs")
    else:
        s3: S3Server = request.getfixturevalue("s3_server")
        url = s3.bucket(f"contract-{os.getpid()}-{next(_buckets)}")
        yield S3BlobStore(url, endpoint_url=s3.endpoint)


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


def test_a_hub_on_s3(tmp_path: Path, s3_server: S3Server, bucket: str) -> None:
    data = tmp_path / "data"
    files = {"same.bin": os.urandom(5000), "edit.bin": os.urandom(3000)}
    src = write_tree(tmp_path / "src", files)
    first = publish(data, "f3", src, block_size=1024, blobs=bucket, s3_endpoint=s3_server.endpoint)
    assert (first.new_blocks, first.new_bytes) == (8, 8000)
    assert not (data / "blobs").exists(), "no block was written locally"
    (src / "edit.bin").write_bytes(os.urandom(3000))
    # The catalog remembers the store: no --blobs needed from now on.
    second = publish(data, "f3", src, block_size=1024, s3_endpoint=s3_server.endpoint)
    assert (second.new_blocks, second.new_bytes) == (3, 3000)
    config = ServerConfig(s3_endpoint=s3_server.endpoint)
    with (
        ServerThread(data, config=config) as server,
        grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        stub = hub_pb2_grpc.HubStub(channel)
        for name, entry in manifest(stub, "f3").items():
            blocks = read_all(stub, [block.digest for block in entry.blocks])
            content = b"".join(blocks[block.digest] for block in entry.blocks)
            assert content == (src / name).read_bytes()
    store = S3BlobStore(bucket, endpoint_url=s3_server.endpoint)
    with Catalog(data / "catalog") as catalog:
        catalog.revoke("f3", "v1")
        assert collect(catalog, store).blobs_deleted == 3
        assert verify(catalog, store, "f3", "v2", blocks=True).ok
    assert len(list(store.iter_digests())) == 8


def test_cli_with_s3(
    tmp_path: Path, s3_server: S3Server, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data, src = str(tmp_path / "data"), str(write_tree(tmp_path / "src", {"a": b"abc"}))
    endpoint = ["--s3-endpoint", s3_server.endpoint]
    assert main(["publish", "--data-dir", data, "f3", src, "--blobs", bucket, *endpoint]) == 0
    assert main(["verify", "--data-dir", data, "f3", "v1", "--blocks", *endpoint]) == 0
    assert capsys.readouterr().out.endswith("ok, 1 blocks\n")
    assert main(["gc", "--data-dir", data, *endpoint]) == 0
    assert "scanned 1 blobs, deleted 0" in capsys.readouterr().err
    assert main(["publish", "--data-dir", data, "f3", src, "--blobs", "elsewhere"]) == 2
    assert "keeps its blocks in s3://" in capsys.readouterr().err
