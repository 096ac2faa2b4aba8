"""What a mount process tells its supervisor about the FUSE connection
(spoke/disk/handover.py), over the socket pair the supervisor gives it: the connection
itself, that a successor resumed it, or that this mount will not hand it over and why —
which a mount whose records could not be kept (a full cache disk) never said, and its
supervisor waited 10 s for a connection that never came before the spoke was ready."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from spoke.disk import handover


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    supervisor, mount = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with supervisor, mount:
        yield supervisor, mount


def test_a_new_mount_hands_over_its_descriptor_and_init_request(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    supervisor, mount = pair
    read, write = os.pipe()
    try:
        handover.publish(mount, write, b"\x01init")
        got = handover.receive(supervisor, 30.0)
        assert isinstance(got, tuple) and got[1] == b"\x01init"
        os.write(got[0], b"x")  # a copy of the same pipe's end
        os.close(got[0])
        assert os.read(read, 1) == b"x"
    finally:
        os.close(read)
        os.close(write)


def test_a_mount_that_will_not_hand_over_says_why_at_once(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    supervisor, mount = pair
    handover.decline(mount, "its records cannot be kept in /cache/.strata: No space left")
    assert handover.receive(supervisor, 30.0) == (
        "its records cannot be kept in /cache/.strata: No space left"
    )
    handover.decline(mount, "é" * 4000)  # at most REASON_MOST bytes, still text
    reason = handover.receive(supervisor, 30.0)
    assert isinstance(reason, str) and len(reason.encode()) <= handover.REASON_MOST
    assert reason.startswith("éé")


def test_a_successor_says_it_resumed_and_silence_is_false(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    supervisor, mount = pair
    handover.announce_resumed(mount)
    assert handover.receive(supervisor, 30.0) is True
    mount.sendall(b"something else")
    assert handover.receive(supervisor, 30.0) is False
    mount.close()  # the mount died: nothing more comes
    assert handover.receive(supervisor, 30.0) is False
