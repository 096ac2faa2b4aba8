"""The hub's read grants on 127.0.0.1: IssueGrant states the caller's token scopes, signed
with the key GrantKeys names; it authenticates like every call and, like tokens, needs TLS
or --insecure; the key is made once in the data directory (owner-only) or taken from
--grant-key."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from deploy.pki import LocalCa
from hub.auth.grants import KEY_FILE
from hub.auth.signing import keygen
from hub.auth.tokens import hash_token
from hub.errors import ConfigError
from hub.publish.tree import publish
from hub.serve.config import ServerConfig
from hub.serve.serverthread import ServerThread
from protocol.grants import grant_message, key_id
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc
from tests.integration.hub_support import RPC_TIMEOUT, bearer, write_tree

ALPHA_TOKEN = "alpha-reader-0123456789abcdef"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    publish(data, "alpha", write_tree(tmp_path / "alpha", {"a.bin": b"alpha bytes"}))
    return data


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.yaml"
    path.write_text(f'"{ALPHA_TOKEN}": ["alpha", "alpha-*"]\n')
    return path


def _stub(port: int) -> Iterator[hub_pb2_grpc.HubStub]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield hub_pb2_grpc.HubStub(channel)


def _holder() -> bytes:
    return Ed25519PrivateKey.generate().public_key().public_bytes_raw()


def test_a_grant_states_the_tokens_scopes_signed_by_the_published_key(
    data: Path, tokens: Path
) -> None:
    config = ServerConfig(tokens=tokens, insecure=True, grant_lifetime_s=30)
    holder = _holder()
    with ServerThread(data, config=config) as server:
        for stub in _stub(server.port):
            grant = stub.IssueGrant(
                hub_pb2.IssueGrantRequest(holder_key=holder, node="10.0.0.7:7879"),
                timeout=RPC_TIMEOUT,
                metadata=bearer(ALPHA_TOKEN),
            )
            keys = stub.GrantKeys(
                hub_pb2.GrantKeysRequest(), timeout=RPC_TIMEOUT, metadata=bearer(ALPHA_TOKEN)
            )
            with pytest.raises(grpc.RpcError) as anonymous:
                stub.IssueGrant(
                    hub_pb2.IssueGrantRequest(holder_key=holder, node="x:1"), timeout=RPC_TIMEOUT
                )
            with pytest.raises(grpc.RpcError) as bad_key:
                stub.IssueGrant(
                    hub_pb2.IssueGrantRequest(holder_key=b"\0" * 5, node="x:1"),
                    timeout=RPC_TIMEOUT,
                    metadata=bearer(ALPHA_TOKEN),
                )
    (key,) = keys.keys
    assert key.key_id == grant.key_id == key_id(key.public_key)
    Ed25519PublicKey.from_public_bytes(key.public_key).verify(
        grant.signature, grant_message(grant.claims)
    )
    claims = hub_pb2.GrantClaims.FromString(grant.claims)
    assert list(claims.scopes) == ["alpha", "alpha-*"]
    assert claims.subject == f"token {hash_token(ALPHA_TOKEN)[:6].hex()}"  # never the token
    assert ALPHA_TOKEN.encode() not in grant.SerializeToString()
    assert claims.holder_key == holder and claims.node == "10.0.0.7:7879"
    assert claims.expires_ns - claims.issued_ns == 30 * 10**9
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert bad_key.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "holder_key" in (bad_key.value.details() or "")


def test_a_plaintext_hub_issues_grants_only_with_insecure(data: Path) -> None:
    with ServerThread(data) as server:
        for stub in _stub(server.port):
            with pytest.raises(grpc.RpcError) as refused:
                stub.IssueGrant(
                    hub_pb2.IssueGrantRequest(holder_key=_holder(), node="x:1"),
                    timeout=RPC_TIMEOUT,
                )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "only over TLS" in (refused.value.details() or "")
    assert not (data / KEY_FILE).exists()  # no key made for grants it cannot issue


def test_a_tls_hub_issues_grants(data: Path, tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()
    ca = LocalCa(tmp_path / "pki", "hub-ca")
    leaf = ca.issue("hub")
    config = ServerConfig(tls_cert=leaf.cert, tls_key=leaf.key)
    credentials = grpc.ssl_channel_credentials(ca.cert.read_bytes())
    with (
        ServerThread(data, config=config) as server,
        grpc.secure_channel(f"127.0.0.1:{server.port}", credentials) as channel,
    ):
        grant = hub_pb2_grpc.HubStub(channel).IssueGrant(
            hub_pb2.IssueGrantRequest(holder_key=_holder(), node="x:1"), timeout=RPC_TIMEOUT
        )
    assert grant.key_id and len(grant.signature) == 64


def test_the_generated_key_is_owner_only_and_kept_across_restarts(data: Path) -> None:
    ids = []
    for _ in range(2):
        with ServerThread(data, config=ServerConfig(insecure=True)) as server:
            for stub in _stub(server.port):
                reply = stub.GrantKeys(hub_pb2.GrantKeysRequest(), timeout=RPC_TIMEOUT)
                ids.append(reply.keys[0].key_id)
    assert ids[0] == ids[1]
    assert stat.S_IMODE((data / KEY_FILE).stat().st_mode) == 0o600


def test_a_given_grant_key_is_used_and_a_readable_one_refused(data: Path, tmp_path: Path) -> None:
    keygen(tmp_path / "grant.key", tmp_path / "grant.pub")
    config = ServerConfig(grant_key=tmp_path / "grant.key", insecure=True)
    with ServerThread(data, config=config) as server:
        for stub in _stub(server.port):
            grant = stub.IssueGrant(
                hub_pb2.IssueGrantRequest(holder_key=_holder(), node="x:1"), timeout=RPC_TIMEOUT
            )
    pem = serialization.load_pem_public_key((tmp_path / "grant.pub").read_bytes())
    assert isinstance(pem, Ed25519PublicKey)
    pem.verify(grant.signature, grant_message(grant.claims))
    assert not (data / KEY_FILE).exists()  # nothing generated when a key is given
    claims = hub_pb2.GrantClaims.FromString(grant.claims)
    assert list(claims.scopes) == ["*"] and claims.subject == "anonymous"
    (tmp_path / "grant.key").chmod(0o644)
    with pytest.raises(ConfigError, match="readable by group or others"):
        ServerThread(data, config=config).start()
