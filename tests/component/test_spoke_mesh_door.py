"""The peer port's door (strata_local/door.py) on real sockets of 127.0.0.1, under mTLS
and the region's token: a flood of connections that never finish their handshake, from
many addresses and far more than the cap, keeps no new peer out and never displaces a
peer's connection that showed the token; the callers' real addresses reach the audit."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from spoke.mesh.peerclient import PeerClient, PeerError
from spoke.mesh.transport import PeerTls, PeerToken
from tests.component.mesh_bulk_support import Owner as AuditedOwner
from tests.component.mesh_bulk_support import region_tls_fixture  # noqa: F401  (region_tls)
from tests.component.mesh_source_support import FakeHub, Owner, _blocks
from tests.support import eventually_async, silent_flood

pytestmark = pytest.mark.timeout(120)

CAP = 64  # --peer-max-connections of the port under test
FLOOD_PER_S = 400  # a new peer keeps its slot about CAP / FLOOD_PER_S = 0.16 s


@pytest.mark.parametrize(
    "says", [b"", b"\x16", b"\x16\x03\x01\x02\x00"], ids=["silent", "one byte", "a record's head"]
)
def test_a_flood_of_silent_connections_keeps_no_new_peer_out(
    tmp_path: Path, region_tls: tuple[PeerTls, PeerToken], says: bytes
) -> None:
    """Connections that send nothing, one byte, or a TLS record's head and no more get no
    relay (the sixteenth probe kept new peers out with 1,800 one-byte connections a
    second when a byte bought one): they hold a slot until displaced."""
    tls, token = region_tls
    blocks = _blocks(2)
    owner_ = Owner(tmp_path / "owner", FakeHub(blocks), blocks)

    async def go() -> tuple[list[str], int, int, int]:
        await owner_.start(token=token, tls=tls, max_connections=CAP)
        door = owner_.server.door
        port = int(owner_.node.rpartition(":")[2])
        first = PeerClient(owner_.node, token, tls)
        await first.probe(5)
        assert door.slots.proven == 1  # the call carried the token: its connection kept
        stop, opened = threading.Event(), []
        flood = threading.Thread(
            target=silent_flood, args=(port, stop, opened, FLOOD_PER_S, "127.0.0", says)
        )
        flood.start()
        answers = []
        try:
            over = door.slots
            await eventually_async(
                lambda: over.displaced + over.refused >= 2 * CAP, "a flood over the cap"
            )
            for _ in range(10):
                newcomer = PeerClient(owner_.node, token, tls)
                try:
                    await newcomer.probe(5)
                    answers.append("OK")
                except PeerError as err:
                    answers.append(f"{err.kind}: {err}")
                finally:
                    await newcomer.close()
                await first.probe(5)
            # the newcomers' connections were closed: their slots free once the door
            # sees their ends (the first peer's is the one left)
            await eventually_async(lambda: door.slots.proven <= 1, "the newcomers' slots freed")
            kept, displaced = door.slots.proven, door.slots.displaced
            relays = len(door._open)  # the flood's connections sent no whole first message
        finally:
            stop.set()
            await asyncio.to_thread(flood.join)
            for sock in opened:
                sock.close()
        await first.close()
        await eventually_async(lambda: door.slots.proven == 0, "the first peer's slot freed")
        await owner_.stop()
        assert relays <= 2, relays  # the first peer's, perhaps a newcomer's closing
        return answers, kept, displaced, len(opened)

    answers, kept, displaced, opened = asyncio.run(go())
    print(f"{opened} silent connections, {displaced} displaced, answers {answers}")
    assert answers == ["OK"] * 10
    # the first peer's connection was never displaced; each newcomer's was released
    assert kept == 1
    assert opened > 3 * CAP


def test_a_refused_call_through_the_door_is_audited_with_the_callers_address(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("region-token-0123456789abcdef\n")
    blocks = _blocks(2)
    owner_ = AuditedOwner(tmp_path / "owner", FakeHub(blocks), blocks)

    async def go() -> tuple[str, int]:
        await owner_.start(token=PeerToken(token_file))
        caller = PeerClient(owner_.node)  # no token
        try:
            await caller.probe(5)
            kind = "answered"
        except PeerError as err:
            kind = err.kind
        finally:
            await caller.close()
        proven = owner_.server.door.slots.proven
        await owner_.stop()
        return kind, proven

    kind, proven = asyncio.run(go())
    assert kind == "refused"
    assert proven == 0  # a refused call proves nothing
    # the address the caller connected from, not the door's socket behind it
    assert [str(r["who"]).rpartition(":")[0] for r in owner_.audit.records] == ["ipv4:127.0.0.1"]
