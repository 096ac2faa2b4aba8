"""Rendezvous hashing and the mesh's settings: owners agree, churn moves only one share,
bad flags are one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from spoke.mesh.rendezvous import owner, ranked
from spoke.mesh.settings import MeshSettings, split_peers
from spoke.run.cli import app
from spoke.run.settings import options

NODES = [f"10.0.0.{i}:7879" for i in range(1, 6)]
KEYS = [f"{i:032x}" for i in range(4000)]


def test_the_owner_does_not_depend_on_the_order_nodes_are_listed() -> None:
    for key in KEYS[:200]:
        assert owner(key, NODES) == owner(key, list(reversed(NODES))) == ranked(key, NODES)[0]


def test_a_node_leaving_moves_only_its_own_keys_to_their_runner_up() -> None:
    before = {k: owner(k, NODES) for k in KEYS}
    gone = NODES[2]
    after = {k: owner(k, [n for n in NODES if n != gone]) for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    assert moved and all(before[k] == gone for k in moved)
    assert all(after[k] == ranked(k, NODES)[1] for k in moved)
    shares = [sum(1 for v in before.values() if v == n) / len(KEYS) for n in NODES]
    assert all(0.15 < s < 0.25 for s in shares)  # about 1/5 each


def test_a_node_joining_takes_keys_only_for_itself() -> None:
    before = {k: owner(k, NODES[:4]) for k in KEYS}
    after = {k: owner(k, NODES) for k in KEYS}
    assert all(after[k] == NODES[4] for k in KEYS if before[k] != after[k])


def test_no_nodes_is_an_error() -> None:
    with pytest.raises(ValueError, match="no nodes"):
        owner(KEYS[0], [])


def test_settings() -> None:
    # (names and addresses only: a plaintext, tokenless peer port needs insecure=True)
    s = MeshSettings(
        listen="0.0.0.0:7879", advertise="10.0.0.1:7879", peers_dns="spokes", insecure=True
    )
    assert s.node == "10.0.0.1:7879" and s.dns == ("spokes", 7879)
    plain = MeshSettings(listen="127.0.0.1:1", peers_dns="spokes:9", insecure=True)
    assert plain.dns == ("spokes", 9)
    assert split_peers(" a:1, ,b:2 ") == ("a:1", "b:2")
    flags = {option.flag: option.field for option in options() if option.mesh}
    given = {"--peer-listen": "127.0.0.1:1", "--peers": "a:1,b:2", "--peer-insecure": True}
    listed = MeshSettings.model_validate({flags[flag]: value for flag, value in given.items()})
    assert listed.peers == ("a:1", "b:2") and listed.insecure
    assert MeshSettings.model_validate_json(listed.model_dump_json()) == listed  # as handed on
    with pytest.raises(ValueError, match="--peer-advertise"):
        MeshSettings(listen="0.0.0.0:7879", insecure=True)
    with pytest.raises(ValueError, match="--peers must be HOST:PORT"):
        MeshSettings(listen="127.0.0.1:1", peers=("nope",), insecure=True)
    with pytest.raises(ValueError, match="go together"):
        MeshSettings(listen="127.0.0.1:1", cert=Path(__file__))
    with pytest.raises(ValueError, match="cleartext"):
        MeshSettings(listen="127.0.0.1:1")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--peers", "a:1"], "need --peer-listen"),
        (["--peer-listen", "127.0.0.1:1", "--peers", "x"], "--peers must be HOST:PORT"),
        (["--peer-listen", "127.0.0.1:1", "--peer-token-file", "/nonexistent"], "missing"),
    ],
)
def test_bad_mesh_flags_are_one_line_errors(tmp_path: Path, flags: list[str], message: str) -> None:
    base = ["daemon", "--hub", "127.0.0.1:1", "--cache-dir", str(tmp_path), "--cache-size", "1MiB"]
    result = CliRunner().invoke(app, [*base, *flags])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_peers_dns_resolves_a_name_to_every_address_and_skips_self() -> None:
    import asyncio

    from spoke.mesh.membership import Membership

    async def go() -> tuple[list[str], list[str]]:
        found = await Membership("10.9.9.9:7879", ["a:1"], dns=("localhost", 7879)).resolve()
        self_only = await Membership("127.0.0.1:7879", dns=("127.0.0.1", 7879)).resolve()
        return found, self_only

    found, self_only = asyncio.run(go())
    assert found[0] == "a:1" and "127.0.0.1:7879" in found
    assert self_only == []
