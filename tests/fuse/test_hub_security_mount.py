"""A spoke talks to a hub with mutual TLS and a scoped token, through a real mount: reads are
byte-identical, a token rotated and a certificate renewed mid-read cost no error, and a
wrong CA, an expired token and a token for another dataset are refused as promised."""

from __future__ import annotations

import datetime
import errno
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.local import LocalStack, admin_headers
from hub.auth.tokenstore import create, revoke
from hub.publish.tree import publish
from hub.serve.config import ServerConfig
from hub.serve.metrics import HubMetrics
from hub.serve.serverthread import ServerThread
from tests.integration.hub_support import (
    Pki,
    pki_fixture,  # noqa: F401  (the pki fixture)
    sample,
    write_tree,
)
from tests.support import eventually, requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse, pytest.mark.timeout(240)]

FILES = {f"part-{i:03d}.bin": os.urandom(70_000 + i) for i in range(60)}  # 2 blocks each


@pytest.fixture(scope="module")
def hub_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("hubsec")
    publish(base / "data", "alpha", write_tree(base / "alpha", FILES), block_size=65536)
    publish(base / "data", "beta", write_tree(base / "beta", {"b.bin": b"beta"}))
    return base / "data"


class SecureHub:
    """A TLS + mTLS + token hub on 127.0.0.1 in this process."""

    def __init__(self, data: Path, pki: Pki, tokens: Path) -> None:
        self.metrics = HubMetrics()
        self.data = data
        self.tokens = tokens
        config = ServerConfig(
            tls_cert=pki.server.cert,
            tls_key=pki.server.key,
            client_ca=pki.ca.pem.cert,
            tokens=tokens,
        )
        self.thread = ServerThread(data, metrics=self.metrics, config=config)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.thread.port}"


@pytest.fixture
def hub(hub_data: Path, pki: Pki, tmp_path: Path) -> Iterator[SecureHub]:
    tokens = tmp_path / "hub-tokens.yaml"
    create(tokens, ["beta"])  # a file with one token in it, so the hub starts
    secure = SecureHub(hub_data, pki, tokens)
    with secure.thread:
        yield secure


def token_file(path: Path, secret: str) -> Path:
    tmp = path.with_suffix(".new")
    tmp.write_text(secret + "\n")
    os.replace(tmp, path)
    return path


def copy_pem(src: Path, dst: Path) -> None:
    tmp = dst.with_suffix(".new")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def spoke_args(pki: Pki, creds: Path, token: Path, ca: Path | None = None) -> tuple[str, ...]:
    creds.mkdir(exist_ok=True)
    cert, key = creds / "spoke.crt", creds / "spoke.key"
    copy_pem(pki.client.cert, cert)
    copy_pem(pki.client.key, key)
    return (
        "--hub-ca",
        str(ca or pki.ca.pem.cert),
        "--hub-server-name",
        "localhost",
        "--hub-cert",
        str(cert),
        "--hub-key",
        str(key),
        "--hub-token-file",
        str(token),
        "--miss-deadline",
        "4",
    )


def metric(admin: str, name: str, auth: dict[str, str]) -> float:
    total = 0.0
    for line in httpx.get(f"{admin}/metrics", headers=auth, timeout=10).text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_mtls_token_mount_and_rotation_while_reading(
    tmp_path: Path, pki: Pki, hub: SecureHub
) -> None:
    first_id, first = create(hub.tokens, ["alpha"])
    token = token_file(tmp_path / "hub-token", first)
    args = spoke_args(pki, tmp_path / "creds", token)
    with LocalStack() as stack:
        admin = stack.start_spoke(
            hub.address,
            tmp_path / "cache",
            tmp_path / "mnt",
            "64MiB",
            extra=args,
            admin_token=True,
        )
        auth = admin_headers(tmp_path / "cache")
        root = tmp_path / "mnt" / "alpha" / "v1"
        assert sorted(os.listdir(tmp_path / "mnt")) == ["alpha"], "the token's scope only"
        ready = httpx.get(f"{admin}/readyz", timeout=10)
        assert ready.status_code == 200, ready.text

        names = sorted(FILES)
        errors: list[BaseException] = []
        done = threading.Event()
        progress = [0]

        def reader() -> None:
            try:
                for name in names:
                    assert (root / name).read_bytes() == FILES[name], name
                    progress[0] += 1
                    time.sleep(0.05)  # a reader spread over the rotation, not a wait
            except BaseException as err:
                errors.append(err)
            finally:
                done.set()

        thread = threading.Thread(target=reader)
        thread.start()
        eventually(lambda: progress[0] >= 10 or done.is_set(), "ten files read", 120)
        # rotate the token: a new one in the spoke's file, then the old one revoked
        _, second = create(hub.tokens, ["alpha"])
        token_file(token, second)
        eventually(
            lambda: metric(admin, "strata_spoke_hub_credential_reloads_total", auth) >= 1,
            "the spoke reloading its token",
        )
        revoke(hub.tokens, first_id)
        # renew the client certificate (a new key too), key and certificate replaced apart
        renewed = pki.ca.issue("spoke-client-renewed")
        copy_pem(renewed.key, tmp_path / "creds" / "spoke.key")
        # product interval: a window in which key and certificate do not match
        time.sleep(0.2)
        copy_pem(renewed.cert, tmp_path / "creds" / "spoke.crt")
        thread.join(120)
        assert not errors, errors
        assert progress[0] == len(names)
        assert metric(admin, 'strata_spoke_hub_credential_reloads_total{what="tls"}', auth) == 1
        assert metric(admin, 'strata_spoke_hub_credential_reloads_total{what="token"}', auth) == 1
        for method in ("ReadBlocks", "Watch", "ResolveRef", "ListVersions", "GetManifest"):
            assert sample(hub.metrics, method, "UNAUTHENTICATED") == 0, method
        assert sample(hub.metrics, "ReadBlocks", "OK") >= 1
        # the Watch stream carries the token too: a publish reaches the mount
        before = metric(admin, "strata_spoke_watch_sequence", auth)
        (tmp_path / "alpha2").mkdir()
        (tmp_path / "alpha2" / "new.bin").write_bytes(b"v2")
        publish(hub.data, "alpha", tmp_path / "alpha2")
        eventually(
            lambda: metric(admin, "strata_spoke_watch_sequence", auth) > before,
            "a catalog event reaching the spoke",
            20,
        )
        new = tmp_path / "mnt" / "alpha" / "v2" / "new.bin"
        # the mount refreshes listings once a second
        eventually(new.exists, "v2 appearing in the mount", 20)
        assert new.read_bytes() == b"v2"


def _refused(tmp_path: Path, hub: SecureHub, args: tuple[str, ...]) -> tuple[str, LocalStack]:
    stack = LocalStack()
    admin = stack.start_spoke(
        hub.address,
        tmp_path / "cache",
        tmp_path / "mnt",
        "64MiB",
        extra=args,
        admin_token=True,
    )
    return admin, stack


@pytest.mark.parametrize("case", ["wrong-ca", "expired-token"])
def test_refusals_are_named_and_reads_fail_with_eio(
    tmp_path: Path, pki: Pki, hub: SecureHub, case: str, capfd: pytest.CaptureFixture[str]
) -> None:
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=31)
    if case == "wrong-ca":
        _, secret = create(hub.tokens, ["alpha"])
        ca = pki.foreign_client.cert.parent / "foreign-ca.crt"
        expected = "the hub's certificate is not trusted by --hub-ca"
    else:
        _, secret = create(hub.tokens, ["alpha"], datetime.timedelta(days=30), now=past)
        ca = None
        expected = "refused the token: bearer token tok-"
    args = spoke_args(pki, tmp_path / "creds", token_file(tmp_path / "tok", secret), ca)
    admin, stack = _refused(tmp_path, hub, args)
    with stack:
        ready = httpx.get(f"{admin}/readyz", timeout=10)
        assert ready.status_code == 503
        assert expected in ready.json()["detail"]
        started = time.monotonic()
        with pytest.raises(OSError) as caught:
            os.listdir(tmp_path / "mnt" / "alpha")
        assert caught.value.errno == errno.EIO
        assert time.monotonic() - started < 30, "a refusal must end in EIO, never hang"
    lines = [line for line in capfd.readouterr().err.splitlines() if expected in line]
    assert lines, "strata-spoke run says why"
    if case == "expired-token":
        assert "expired at" in lines[0]


def test_token_for_another_dataset(tmp_path: Path, pki: Pki, hub: SecureHub) -> None:
    _, secret = create(hub.tokens, ["beta"])
    args = spoke_args(pki, tmp_path / "creds", token_file(tmp_path / "tok", secret))
    admin, stack = _refused(tmp_path, hub, args)
    with stack:
        assert os.listdir(tmp_path / "mnt") == ["beta"]
        assert (tmp_path / "mnt" / "beta" / "v1" / "b.bin").read_bytes() == b"beta"
        with pytest.raises(OSError) as caught:
            os.stat(tmp_path / "mnt" / "alpha")
        assert caught.value.errno in (errno.ENOENT, errno.EACCES)
        auth = {
            "Authorization": f"Bearer {(tmp_path / 'cache' / 'admin.token').read_text().strip()}"
        }
        reply = httpx.post(
            f"{admin}/v1/prewarm", json={"dataset": "alpha"}, headers=auth, timeout=10
        )
        assert reply.status_code == 403
        assert "may not read dataset 'alpha'" in reply.json()["detail"]
        assert sample(hub.metrics, "ResolveRef", "PERMISSION_DENIED") >= 1
