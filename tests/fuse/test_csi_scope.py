"""Who may mount what through strata-csi: a pod's namespace (and service account) in the
tenancy policy, read again at each publish; a volume's own hub token, checked against the
hub's scope in plaintext and against a hub that requires client certificates; and the
``--hub`` flags the plugin refuses to start without.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from csi.mounttable import mounted_at
from deploy.pki import Leaf, LocalCa
from protocol.csi.v1 import csi_pb2
from tests.fuse.csi_support import (
    MARKS,
    POD_NAMESPACE,
    SERVICE_ACCOUNT,
    Plugin,
    code_of,
    plugin_fixture,  # noqa: F401  (the plugin fixture)
    plugin_process,
    request,
    target_of,
    unpublish,
)
from tests.support import eventually, tree_digests

pytestmark = MARKS


def test_a_pod_mounts_only_what_its_namespace_may(plugin: Plugin) -> None:
    """Decided from what the kubelet vouches for (the pod's namespace and service
    account), never from the volume's attributes alone; deny by default (issue 39: a pod
    of tenant-b published team-a's dataset)."""
    target = target_of(plugin, "pod-tenant-b")
    denied = request("vol-b", target, dataset="demo", ref="v1", **{POD_NAMESPACE: "tenant-b"})
    got, details = code_of(plugin.node.NodePublishVolume, denied)
    assert got == grpc.StatusCode.PERMISSION_DENIED, details
    assert "tenant-b" in details and "'demo'" in details
    assert not target.exists() and mounted_at(target) is None
    own = request("vol-b", target, dataset="other", ref="v1", **{POD_NAMESPACE: "tenant-b"})
    plugin.node.NodePublishVolume(own)
    assert (target / "b.txt").read_text() == "tenant b's\n"
    # the bind exposes that one version: its ".." is the pod's volume directory
    assert os.listdir(target) == ["b.txt"]
    assert os.path.realpath(target / "..") == str(target.parent)
    assert not (target / ".." / "v1").exists() and not (target / ".." / "demo").exists()
    unpublish(plugin, "vol-b", target)
    # one service account of a namespace, not the others
    trainer = {POD_NAMESPACE: "tenant-c", SERVICE_ACCOUNT: "trainer"}
    plugin.node.NodePublishVolume(request("vol-c", target, dataset="demo", ref="v1", **trainer))
    unpublish(plugin, "vol-c", target)
    other_account = {POD_NAMESPACE: "tenant-c", SERVICE_ACCOUNT: "default"}
    got, _ = code_of(
        plugin.node.NodePublishVolume,
        request("vol-c", target, dataset="demo", ref="v1", **other_account),
    )
    assert got == grpc.StatusCode.PERMISSION_DENIED
    # no namespace from the kubelet: refused, naming the CSIDriver setting
    anonymous = request("vol-x", target, dataset="demo", ref="v1")
    del anonymous.volume_context[POD_NAMESPACE]
    got, details = code_of(plugin.node.NodePublishVolume, anonymous)
    assert got == grpc.StatusCode.PERMISSION_DENIED and "podInfoOnMount" in details
    records = [json.loads(line) for line in (plugin.state / "audit.jsonl").read_text().splitlines()]
    refused = [r for r in records if r["outcome"] == "denied"]
    assert {r["who"].split()[1].split("/")[0] for r in refused} >= {"tenant-b", "tenant-c"}
    assert any(r["what"] == "publish other@v1" and r["outcome"] == "ok" for r in records)


def test_a_changed_policy_applies_to_the_next_publish(plugin: Plugin) -> None:
    policy = plugin.pods.parent / "csi-tenancy.yaml"
    before = policy.read_text()
    target = target_of(plugin, "pod-policy")
    ask = request("vol-p", target, dataset="demo", ref="v1", **{POD_NAMESPACE: "tenant-d"})
    assert code_of(plugin.node.NodePublishVolume, ask)[0] == grpc.StatusCode.PERMISSION_DENIED
    try:
        policy.write_text(before + "tenant-d: [de*]\n")
        plugin.node.NodePublishVolume(ask)
        unpublish(plugin, "vol-p", target)
        policy.write_text("tenant-d: [not a list\n")  # broken: the last good one stays
        plugin.node.NodePublishVolume(ask)
        unpublish(plugin, "vol-p", target)
    finally:
        policy.write_text(before)
    assert code_of(plugin.node.NodePublishVolume, ask)[0] == grpc.StatusCode.PERMISSION_DENIED


def test_a_volumes_own_token_is_checked_against_the_hubs_scope(plugin: Plugin) -> None:
    """A volume whose secret carries a hub token is published when the hub lets that token
    read the dataset, whatever the namespace's policy, and refused when it does not (a
    token of another dataset, an unknown one); without --hub a token cannot be checked."""
    from hub.serve.config import ServerConfig
    from hub.serve.serverthread import ServerThread

    tmp = plugin.pods.parent
    tokens = tmp / "hub-tokens.yaml"
    tokens.write_text('"token-of-demo-0123456789": [demo]\n"token-of-other-0123456789": [other]\n')
    tokens.chmod(0o600)
    config = ServerConfig(tokens=tokens, insecure=True)
    target = target_of(plugin, "pod-secret")
    outsider = {POD_NAMESPACE: "tenant-z"}  # no tenancy entry names it
    ask = request("vol-s", target, dataset="demo", ref="v1", **outsider)
    ask.secrets["token"] = "token-of-demo-0123456789"
    got, details = code_of(plugin.node.NodePublishVolume, ask)
    assert got == grpc.StatusCode.PERMISSION_DENIED and "--hub" in details
    with ServerThread(plugin.hub_dir, config=config) as hub:
        extra = ("--hub", f"127.0.0.1:{hub.port}", "--hub-insecure")
        with plugin_process(tmp, plugin.mount, "secret", plugin.pods, extra) as (_, node, _s):
            node.NodePublishVolume(ask)
            assert tree_digests(target) == tree_digests(plugin.src["v1"])
            node.NodeUnpublishVolume(
                csi_pb2.NodeUnpublishVolumeRequest(volume_id="vol-s", target_path=str(target))
            )
            for token, says in (
                ("token-of-other-0123456789", "may not read"),
                ("not-a-token-at-all-0123456", "may not read"),
            ):
                ask.secrets["token"] = token
                got, details = code_of(node.NodePublishVolume, ask)
                assert got == grpc.StatusCode.PERMISSION_DENIED and says in details, details
                assert not target.exists()


def test_a_volumes_token_is_refused_by_a_hub_that_checks_no_tokens(plugin: Plugin) -> None:
    """The sixteenth probe: against a hub without --tokens, which answers every call as
    anonymous, any string as a volume's token published any dataset. Such a hub's allow
    vouches for nothing: the token is refused, with the reason."""
    from hub.serve.config import ServerConfig
    from hub.serve.serverthread import ServerThread

    tmp = plugin.pods.parent
    target = target_of(plugin, "pod-open-hub")
    ask = request("vol-o", target, dataset="demo", ref="v1", **{POD_NAMESPACE: "tenant-z"})
    ask.secrets["token"] = "anything-at-all-0123456789"
    with ServerThread(plugin.hub_dir, config=ServerConfig(insecure=True)) as hub:
        extra = ("--hub", f"127.0.0.1:{hub.port}", "--hub-insecure")
        with plugin_process(tmp, plugin.mount, "open-hub", plugin.pods, extra) as (_, node, _s):
            got, details = code_of(node.NodePublishVolume, ask)
    assert got == grpc.StatusCode.PERMISSION_DENIED and "checks no tokens" in details, details
    assert not target.exists()


@pytest.fixture(scope="module")
def pki(plugin: Plugin) -> dict[str, Leaf]:
    """The hub's CA, its server certificate, a client certificate of that CA (the spoke's,
    which the DaemonSet gives the plugin too) and one of a foreign CA."""
    directory = plugin.pods.parent / "pki"
    directory.mkdir()
    ca, foreign = LocalCa(directory, "hub-ca"), LocalCa(directory, "x")
    return {
        "ca": ca.pem,
        "server": ca.issue("hub-server"),
        "client": ca.issue("spoke-client"),
        "foreign": foreign.issue("intruder"),
    }


def test_a_volumes_own_token_against_a_hub_that_requires_client_certificates(
    plugin: Plugin, pki: dict[str, Leaf]
) -> None:
    """Against the hub as shipped (TLS, client certificates from its CA, tokens), a plugin
    with the spoke's certificate publishes a volume whose token covers the dataset and
    refuses one whose token does not (PERMISSION_DENIED); without a client certificate, or
    with a foreign one, the publish fails FAILED_PRECONDITION with one line that names
    the flags to fix, and the plugin said so in its log at start."""
    from hub.serve.config import ServerConfig
    from hub.serve.serverthread import ServerThread

    tmp = plugin.pods.parent
    tokens = tmp / "mtls-tokens.yaml"
    tokens.write_text('"token-of-demo-0123456789": [demo]\n"token-of-other-0123456789": [other]\n')
    tokens.chmod(0o600)
    config = ServerConfig(
        tokens=tokens,
        tls_cert=pki["server"].cert,
        tls_key=pki["server"].key,
        client_ca=pki["ca"].cert,
    )
    target = target_of(plugin, "pod-mtls")
    ask = request("vol-m", target, dataset="demo", ref="v1", **{POD_NAMESPACE: "tenant-z"})
    with ServerThread(plugin.hub_dir, config=config) as hub:
        tls = ("--hub", f"127.0.0.1:{hub.port}", "--hub-ca", str(pki["ca"].cert))
        tls += ("--hub-server-name", "localhost")
        client = ("--hub-cert", str(pki["client"].cert), "--hub-key", str(pki["client"].key))
        with plugin_process(tmp, plugin.mount, "mtls", plugin.pods, (*tls, *client)) as (
            _,
            node,
            _s,
        ):
            ask.secrets["token"] = "token-of-demo-0123456789"
            node.NodePublishVolume(ask)
            assert tree_digests(target) == tree_digests(plugin.src["v1"])
            node.NodeUnpublishVolume(
                csi_pb2.NodeUnpublishVolumeRequest(volume_id="vol-m", target_path=str(target))
            )
            ask.secrets["token"] = "token-of-other-0123456789"
            got, details = code_of(node.NodePublishVolume, ask)
            assert got == grpc.StatusCode.PERMISSION_DENIED and "may not read" in details
            assert not target.exists()
        assert "answers (TLS: with client certificate)" in (tmp / "mtls.log").read_text()

        ask.secrets["token"] = "token-of-demo-0123456789"
        foreign = ("--hub-cert", str(pki["foreign"].cert), "--hub-key", str(pki["foreign"].key))
        for name, extra, says in (
            ("mtls-none", (), "requires a client certificate and this plugin presents none"),
            ("mtls-foreign", foreign, "refused this plugin's client certificate"),
        ):
            with plugin_process(tmp, plugin.mount, name, plugin.pods, (*tls, *extra)) as (
                _,
                node,
                _s,
            ):
                got, details = code_of(node.NodePublishVolume, ask)
                assert got == grpc.StatusCode.FAILED_PRECONDITION, (got, details)
                assert says in details and "\n" not in details, details
                if not extra:
                    assert "--hub-cert and --hub-key" in details
                assert not target.exists()
                log = tmp / f"{name}.log"
                eventually(lambda log=log: "cannot be checked" in log.read_text(), "greet")
                (line,) = [x for x in log.read_text().splitlines() if "cannot be checked" in x]
                assert says in line


def test_hub_without_tls_needs_hub_insecure(tmp_path: Path) -> None:
    """A plugin told to ask a hub in plaintext refuses to start without --hub-insecure: it
    would send volumes' tokens in clear; and the TLS files are checked at start."""
    base = [sys.executable, "-m", "csi", "serve", "--endpoint", f"unix://{tmp_path}/s.sock"]
    base += ["--node-id", "n", "--state-dir", str(tmp_path / "state"), "--pods-dir", "/tmp"]
    for extra, says in (
        (["--hub", "127.0.0.1:1"], "--hub-insecure"),
        (["--hub", "127.0.0.1:1", "--hub-ca", str(tmp_path / "nope.crt")], "--hub-ca"),
        (["--hub", "127.0.0.1:1", "--hub-ca", "/etc/hostname", "--hub-cert", "/x"], "together"),
    ):
        done = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert says in done.stderr, done.stderr
