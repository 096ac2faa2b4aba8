"""TLS, mutual TLS and bearer tokens with per-dataset read scope, on 127.0.0.1."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hub.publish.tree import publish
from hub.serve.config import ServerConfig
from hub.serve.metrics import HubMetrics
from hub.serve.serverthread import ServerThread
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc
from tests.integration.hub_support import (
    RPC_TIMEOUT,
    Pki,
    bearer,
    manifest,
    pki_fixture,  # noqa: F401  (the pki fixture)
    read_all,
    sample,
    serves,
    write_tree,
)

ALPHA_TOKEN = "alpha-reader-0123456789abcdef"
ADMIN_TOKEN = "platform-team-fedcba9876543210"
SHARED = b"a block both datasets hold"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("secure")
    data = base / "data"
    alpha = write_tree(base / "alpha", {"own.bin": os.urandom(3000), "shared.bin": SHARED})
    beta = write_tree(base / "beta", {"secret.bin": os.urandom(3000), "shared.bin": SHARED})
    publish(data, "alpha", alpha)
    publish(data, "beta", beta)
    return data


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokens") / "tokens.yaml"
    path.write_text(f'"{ALPHA_TOKEN}": ["alpha"]\n"{ADMIN_TOKEN}": "*"\n')
    return path


@pytest.fixture(scope="module")
def metrics() -> HubMetrics:
    return HubMetrics()


@pytest.fixture(scope="module")
def token_port(data: Path, tokens_file: Path, metrics: HubMetrics) -> Iterator[int]:
    config = ServerConfig(tokens=tokens_file, insecure=True)
    with ServerThread(data, metrics=metrics, config=config) as server:
        yield server.port


@pytest.fixture(scope="module")
def token_hub(token_port: int) -> Iterator[hub_pb2_grpc.HubStub]:
    with grpc.insecure_channel(f"127.0.0.1:{token_port}") as channel:
        yield hub_pb2_grpc.HubStub(channel)


def resolve(stub: hub_pb2_grpc.HubStub, dataset: str, metadata: tuple[tuple[str, str], ...]) -> str:
    request = hub_pb2.ResolveRefRequest(dataset=dataset, ref="latest")
    return str(stub.ResolveRef(request, timeout=RPC_TIMEOUT, metadata=metadata).version)


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ((), "missing bearer token"),
        (bearer("not-a-token-anyone-knows"), "unknown bearer token"),
        ((("authorization", f"Basic {ALPHA_TOKEN}"),), "expected 'Bearer <token>'"),
        (bearer(ALPHA_TOKEN[:-1]), "unknown bearer token"),
    ],
    ids=["missing", "wrong", "not-bearer", "truncated"],
)
def test_missing_or_wrong_token_is_unauthenticated(
    token_hub: hub_pb2_grpc.HubStub,
    metrics: HubMetrics,
    metadata: tuple[tuple[str, str], ...],
    message: str,
) -> None:
    before = sample(metrics, "ResolveRef", "UNAUTHENTICATED")
    with pytest.raises(grpc.RpcError) as caught:
        resolve(token_hub, "alpha", metadata)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert message in caught.value.details()
    assert sample(metrics, "ResolveRef", "UNAUTHENTICATED") == before + 1
    assert serves(token_hub, bearer(ADMIN_TOKEN))


def test_every_rpc_checks_the_token(token_hub: hub_pb2_grpc.HubStub) -> None:
    calls = {
        "ListDatasets": lambda: token_hub.ListDatasets(
            hub_pb2.ListDatasetsRequest(), timeout=RPC_TIMEOUT
        ),
        "ListVersions": lambda: token_hub.ListVersions(
            hub_pb2.ListVersionsRequest(dataset="alpha"), timeout=RPC_TIMEOUT
        ),
        "GetManifest": lambda: list(
            token_hub.GetManifest(
                hub_pb2.GetManifestRequest(dataset="alpha", ref="v1"), timeout=RPC_TIMEOUT
            )
        ),
        "ListDirectory": lambda: token_hub.ListDirectory(
            hub_pb2.ListDirectoryRequest(dataset="alpha", ref="v1"), timeout=RPC_TIMEOUT
        ),
        "ReadBlocks": lambda: list(
            token_hub.ReadBlocks(iter([hub_pb2.ReadBlocksRequest()]), timeout=RPC_TIMEOUT)
        ),
        "Watch": lambda: list(token_hub.Watch(hub_pb2.WatchRequest(), timeout=RPC_TIMEOUT)),
    }
    for name, call in calls.items():
        with pytest.raises(grpc.RpcError) as caught:
            call()
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, name


def test_scope_limits_datasets(token_hub: hub_pb2_grpc.HubStub, metrics: HubMetrics) -> None:
    alpha = bearer(ALPHA_TOKEN)
    assert resolve(token_hub, "alpha", alpha) == "v1"
    before = sample(metrics, "ResolveRef", "PERMISSION_DENIED")
    with pytest.raises(grpc.RpcError) as caught:
        resolve(token_hub, "beta", alpha)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "may not read dataset 'beta'" in caught.value.details()
    assert sample(metrics, "ResolveRef", "PERMISSION_DENIED") == before + 1
    # Unknown datasets outside the scope are denied too: existence is not revealed.
    with pytest.raises(grpc.RpcError) as caught:
        resolve(token_hub, "gamma", alpha)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    listed = token_hub.ListDatasets(hub_pb2.ListDatasetsRequest(), timeout=5, metadata=alpha)
    assert [d.name for d in listed.datasets] == ["alpha"]
    everything = token_hub.ListDatasets(
        hub_pb2.ListDatasetsRequest(), timeout=RPC_TIMEOUT, metadata=bearer(ADMIN_TOKEN)
    )
    assert [d.name for d in everything.datasets] == ["alpha", "beta"]


def test_guessed_digests_of_another_dataset_are_not_served(
    token_hub: hub_pb2_grpc.HubStub, metrics: HubMetrics
) -> None:
    admin, alpha = bearer(ADMIN_TOKEN), bearer(ALPHA_TOKEN)
    beta = manifest(token_hub, "beta", metadata=admin)
    secret = beta["secret.bin"].blocks[0].digest
    shared = beta["shared.bin"].blocks[0].digest
    assert read_all(token_hub, [secret], admin)[secret]
    before = sample(metrics, "ReadBlocks", "NOT_FOUND")
    with pytest.raises(grpc.RpcError) as caught:
        read_all(token_hub, [secret], alpha)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == f"unknown block {secret}"
    assert sample(metrics, "ReadBlocks", "NOT_FOUND") == before + 1
    # A block alpha holds too is alpha's to read, whoever else holds it.
    assert read_all(token_hub, [shared], alpha) == {shared: SHARED}


def test_watch_shows_only_readable_datasets(token_hub: hub_pb2_grpc.HubStub) -> None:
    request = hub_pb2.WatchRequest(after_sequence=0)
    with pytest.raises(grpc.RpcError) as caught:
        for _ in token_hub.Watch(request, timeout=1.0, metadata=bearer(ALPHA_TOKEN)):
            pass
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    seen = []
    call = token_hub.Watch(request, timeout=RPC_TIMEOUT, metadata=bearer(ALPHA_TOKEN))
    for event in call:
        seen.append(event)
        if event.kind == hub_pb2.EVENT_KIND_TAG_MOVED:
            break
    call.cancel()
    assert {event.dataset for event in seen} == {"alpha"}
    denied = hub_pb2.WatchRequest(datasets=["beta"])
    with pytest.raises(grpc.RpcError) as caught:
        list(token_hub.Watch(denied, timeout=RPC_TIMEOUT, metadata=bearer(ALPHA_TOKEN)))
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_health_needs_no_token(token_hub: hub_pb2_grpc.HubStub, token_port: int) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{token_port}") as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="protocol.hub.v1.Hub"), timeout=RPC_TIMEOUT
        )
    assert response.status == health_pb2.HealthCheckResponse.SERVING


# TLS and mutual TLS.


@pytest.fixture(scope="module")
def tls_port(data: Path, pki: Pki) -> Iterator[int]:
    config = ServerConfig(tls_cert=pki.server.cert, tls_key=pki.server.key)
    with ServerThread(data, config=config) as server:
        yield server.port


@pytest.fixture(scope="module")
def mtls(data: Path, pki: Pki) -> Iterator[tuple[int, HubMetrics]]:
    metrics = HubMetrics()
    config = ServerConfig(
        tls_cert=pki.server.cert, tls_key=pki.server.key, client_ca=pki.ca.pem.cert
    )
    with ServerThread(data, metrics=metrics, config=config) as server:
        yield server.port, metrics


def tls_stub(
    port: int, pki: Pki, client: tuple[bytes, bytes] | None = None
) -> tuple[grpc.Channel, hub_pb2_grpc.HubStub]:
    key, cert = client if client is not None else (None, None)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.ca.pem.cert_bytes, private_key=key, certificate_chain=cert
    )
    channel = grpc.secure_channel(f"127.0.0.1:{port}", credentials)
    return channel, hub_pb2_grpc.HubStub(channel)


def test_tls(tls_port: int, pki: Pki) -> None:
    channel, stub = tls_stub(tls_port, pki)
    with channel:
        assert resolve(stub, "alpha", ()) == "v1"
    with grpc.insecure_channel(f"127.0.0.1:{tls_port}") as plain:
        with pytest.raises(grpc.RpcError) as caught:
            resolve(hub_pb2_grpc.HubStub(plain), "alpha", ())
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_accepts_its_own_clients(mtls: tuple[int, HubMetrics], pki: Pki) -> None:
    port, metrics = mtls
    channel, stub = tls_stub(port, pki, (pki.client.key_bytes, pki.client.cert_bytes))
    with channel:
        assert resolve(stub, "alpha", ()) == "v1"
    assert sample(metrics, "ResolveRef", "OK") >= 1


@pytest.mark.parametrize("who", ["no-certificate", "foreign-ca"])
def test_mutual_tls_refuses_other_clients(mtls: tuple[int, HubMetrics], pki: Pki, who: str) -> None:
    """The handshake fails in gRPC core before any RPC exists: no handler, no count."""
    port, metrics = mtls
    client = (
        None
        if who == "no-certificate"
        else (pki.foreign_client.key_bytes, pki.foreign_client.cert_bytes)
    )
    served = sample(metrics, "ResolveRef", "OK")
    channel, stub = tls_stub(port, pki, client)
    with channel, pytest.raises(grpc.RpcError) as caught:
        resolve(stub, "alpha", ())
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details()
    assert sample(metrics, "ResolveRef", "OK") == served, "nothing was served to it"
    good, good_stub = tls_stub(port, pki, (pki.client.key_bytes, pki.client.cert_bytes))
    with good:
        assert resolve(good_stub, "alpha", ()) == "v1"


def test_tls_configuration_errors(data: Path, pki: Pki) -> None:
    from hub.errors import ConfigError

    for config, message in [
        (ServerConfig(tls_cert=pki.server.cert), "both --tls-cert and --tls-key"),
        (ServerConfig(client_ca=pki.ca.pem.cert), "--client-ca needs"),
        (ServerConfig(tls_cert=pki.server.cert, tls_key=data / "nope.key"), "cannot read"),
        (
            ServerConfig(tls_cert=pki.server.cert, tls_key=pki.server.cert.parent / "x"),
            "cannot read",
        ),
    ]:
        with pytest.raises(ConfigError, match=message):
            ServerThread(data, config=config).start()


def test_refused_calls_are_in_the_audit_log(token_hub: hub_pb2_grpc.HubStub, data: Path) -> None:
    import json

    with pytest.raises(grpc.RpcError):
        resolve(token_hub, "alpha", bearer("an-unknown-token-0123456789"))
    with pytest.raises(grpc.RpcError):
        resolve(token_hub, "beta", bearer(ALPHA_TOKEN))
    records = [json.loads(line) for line in (data / "audit.jsonl").read_text().splitlines()]
    outcomes = {(r["what"], r["outcome"]) for r in records}
    assert ("ResolveRef", "UNAUTHENTICATED") in outcomes
    assert ("ResolveRef", "PERMISSION_DENIED") in outcomes
    assert all(r["who"].startswith("ipv4:127.0.0.1:") for r in records)
    text = (data / "audit.jsonl").read_text()
    assert ALPHA_TOKEN not in text and "an-unknown-token" not in text
