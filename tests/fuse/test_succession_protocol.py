"""Spoke succession without a kernel mount (spoke/run/succession.py): the terms and their
refusals, the wire, and the predecessor's steps against a stand-in supervisor — what it
stops, in which order, and that whatever goes wrong after it stopped something ends in
``serve_again``. tests/fuse/test_succession.py runs the real thing."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.local import free_port
from spoke.disk.handover import RESUME_FORMAT
from spoke.disk.layout import CacheLayout
from spoke.run import succession
from spoke.run.startup import StartupError

MNT = Path("/mnt/strata/data")


def test_terms_that_cannot_agree_are_refused_with_what_to_do() -> None:
    mine = succession.terms(MNT, allow_other=False)
    assert succession.refusal(dict(mine), mine) == ""
    for changed, said in (
        ({"protocol": succession.PROTOCOL + 1}, "succession protocol"),
        ({"protocol": None}, "succession protocol None"),
        ({"resume_format": RESUME_FORMAT + 1}, "backing ledger format"),
        ({"mount": "/elsewhere"}, "it would mount /elsewhere"),
        ({"allow_other": True}, "--allow-other differs"),
    ):
        assert said in succession.refusal({**mine, **changed}, mine), changed


class FakePredecessor:
    """A supervisor that records which steps :func:`succession.hand_over` took."""

    def __init__(self, root: Path, refusal: str = "") -> None:
        self.layout = CacheLayout(root)
        self.mountpoint = MNT
        self.steps: list[str] = []
        self._refusal = refusal
        self.lock = os.open(root / "spoke.lock", os.O_RDWR | os.O_CREAT, 0o600)
        self.fuse = os.open("/dev/null", os.O_RDWR)  # stands in for /dev/fuse

    def succession_terms(self) -> dict[str, Any]:
        return succession.terms(MNT, allow_other=False)

    def succession_refusal(self) -> str:
        return self._refusal

    def lock_descriptor(self) -> int:
        return self.lock

    def stop_daemon(self) -> None:
        self.steps.append("stop_daemon")

    def connection(self) -> tuple[int, bytes]:
        self.steps.append("connection")
        return self.fuse, b"INIT"

    def stop_mount(self) -> None:
        self.steps.append("stop_mount")

    def serve_again(self) -> None:
        self.steps.append("serve_again")

    def audit(self, outcome: str, **details: object) -> None:
        self.steps.append(f"audit {outcome.split(':')[0]}")


def _run(spoke: FakePredecessor, successor: Any) -> int | None:
    """``hand_over`` on one end of a socket pair, ``successor(sock)`` on the other."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    thread = threading.Thread(target=successor, args=(theirs,))
    thread.start()
    try:
        return succession.hand_over(ours, spoke)
    finally:
        thread.join(30)


def _say(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendmsg([json.dumps(message).encode()])


def _hear(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(sock, 65536, 4)
    return json.loads(data), fds


def _hello() -> dict[str, Any]:
    return {"op": "succeed", "pid": 4242, "version": "next", **succession.terms(MNT, False)}


def test_a_whole_succession_in_order(tmp_path: Path) -> None:
    spoke = FakePredecessor(tmp_path)
    got: dict[str, Any] = {}

    def successor(sock: socket.socket) -> None:
        with sock:
            _say(sock, _hello())
            got["lock"] = _hear(sock)
            _say(sock, {"op": "connection"})
            got["connection"] = _hear(sock)
            _say(sock, {"op": "stop"})
            got["stopped"] = _hear(sock)
            _say(sock, {"op": "serving"})

    assert _run(spoke, successor) == 4242
    assert spoke.steps == ["stop_daemon", "connection", "stop_mount", "audit handed over"]
    (reply, fds) = got["lock"]
    assert reply["ok"] is True and reply["pid"] == os.getpid() and len(fds) == 1
    assert os.fstat(fds[0]).st_ino == os.fstat(spoke.lock).st_ino  # the lock's own file
    (reply, more) = got["connection"]
    assert reply == {"ok": True, "init": b"INIT".hex()} and len(more) == 1
    assert got["stopped"] == ({"ok": True}, [])
    for fd in fds + more:
        os.close(fd)


@pytest.mark.parametrize(
    "vanish_after", ["hello", "lock", "connection", "stopped", "garbage", "abort"]
)
def test_whatever_goes_wrong_after_a_stop_ends_in_serve_again(
    tmp_path: Path, vanish_after: str
) -> None:
    spoke = FakePredecessor(tmp_path)

    def successor(sock: socket.socket) -> None:
        with sock:
            _say(sock, _hello())
            if vanish_after == "hello":
                return
            for fd in _hear(sock)[1]:
                os.close(fd)
            if vanish_after == "garbage":
                sock.sendmsg([b"\xff not json"])
                return
            if vanish_after == "abort":
                _say(sock, {"op": "abort", "reason": "its daemon did not start"})
                return
            if vanish_after == "lock":
                return
            _say(sock, {"op": "connection"})
            for fd in _hear(sock)[1]:
                os.close(fd)
            if vanish_after == "connection":
                return
            _say(sock, {"op": "stop"})
            _hear(sock)

    assert _run(spoke, successor) is None
    assert spoke.steps[0] == "stop_daemon"
    assert spoke.steps[-2:] == ["audit failed", "serve_again"]


def test_a_refusal_stops_nothing(tmp_path: Path) -> None:
    spoke = FakePredecessor(tmp_path, refusal="its mount or daemon is restarting: try again")
    got: dict[str, Any] = {}

    def successor(sock: socket.socket) -> None:
        with sock:
            _say(sock, _hello())
            got["reply"] = _hear(sock)

    assert _run(spoke, successor) is None
    assert spoke.steps == ["audit refused"]
    reply, fds = got["reply"]
    assert reply["ok"] is False and "restarting" in reply["reason"] and fds == []


class FakeSuccessor:
    layout: CacheLayout
    mountpoint = MNT

    def __init__(self, root: Path) -> None:
        self.layout = CacheLayout(root)

    def succession_terms(self) -> dict[str, Any]:
        return succession.terms(MNT, allow_other=True)


def test_a_successor_hears_the_refusal_and_the_predecessor_serves_on(tmp_path: Path) -> None:
    """The real listener: a successor whose terms differ is told why, in its one-line
    error; nothing there stops."""
    spoke = FakePredecessor(tmp_path)
    spoke.layout.private_dir.mkdir(mode=0o700)
    listener = succession.Listener(spoke.layout.succession_socket)
    assert oct(os.stat(spoke.layout.succession_socket).st_mode & 0o777) == "0o600"
    errors: list[str] = []

    def take() -> None:
        try:
            succession.take_over(FakeSuccessor(tmp_path), 1234)  # type: ignore[arg-type]
        except StartupError as err:
            errors.append(str(err))

    thread = threading.Thread(target=take)
    thread.start()
    try:
        peer = None
        for _ in range(200):
            peer = listener.accept()
            if peer is not None:
                break
            threading.Event().wait(0.05)
        assert peer is not None
        assert succession.hand_over(peer, spoke) is None
    finally:
        thread.join(30)
        listener.close()
    assert not spoke.layout.succession_socket.exists()
    assert spoke.steps == ["audit refused"]
    (error,) = errors
    assert "(pid 1234) refused the take-over: --allow-other differs" in error


def test_a_retired_spoke_answers_its_probes_alive_and_not_ready() -> None:
    address = f"127.0.0.1:{free_port()}"
    probes = succession.RetiredProbes(address)
    try:
        assert httpx.get(f"http://{address}/healthz").status_code == 200
        assert httpx.get(f"http://{address}/readyz").status_code == 503
        assert httpx.get(f"http://{address}/metrics").status_code == 404
    finally:
        probes.close()
    with pytest.raises(ValueError):
        succession.RetiredProbes("no-port")
