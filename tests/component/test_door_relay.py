"""The door's relay (strata_local/door.py) on real sockets: bytes arrive identical through
its pipes, and a pipe is one page while its connection is idle and 1 MiB only while answers
come a pipeful at a time — a user without CAP_SYS_RESOURCE has 16,384 pipe pages, which
1 MiB for every connection spent in 60 (issue 39's twenty-first probe)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import stat

import pytest

from strata_local import door as door_module
from strata_local.door import PIPE_BYTES, PIPE_IDLE_BYTES, Door
from strata_local.doorway import PREFACE
from tests.support import eventually_async

MiB = 1 << 20


def _pipe_sizes(besides: frozenset[int] = frozenset()) -> dict[int, int]:
    """This process's pipes but ``besides`` (descriptors), and their sizes in bytes."""
    sizes = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd not in besides and stat.S_ISFIFO(os.fstat(fd).st_mode):
                sizes[fd] = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
        except OSError:
            continue  # the listing's own descriptor, closed since
    return sizes


async def _answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The backend: reads the preface, then answers each 8-byte request ``n`` with ``n``
    bytes of a pattern."""
    await reader.readexactly(len(PREFACE))
    while ask := await reader.read(8):
        n = int.from_bytes(ask, "big")
        writer.write(bytes(i % 251 for i in range(n)))
        await writer.drain()
    writer.close()


def test_answers_arrive_whole_and_a_pipe_is_large_only_while_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sized: list[int] = []  # every size the relay's pipes were given, in order

    def resize(pipe: int, size: int) -> int:
        sized.append(real_resize(pipe, size))
        return sized[-1]

    real_resize = door_module._resize
    monkeypatch.setattr(door_module, "_resize", resize)

    async def go() -> tuple[list[int], list[int], bool]:
        theirs = frozenset(_pipe_sizes())  # pytest's, say: not the door's
        door = Door(64, credentials=False, silent_s=5.0)
        backend = await asyncio.start_unix_server(_answers, door.backend.removeprefix("unix:"))
        port = await door.start("127.0.0.1", 0)
        idle = []
        for _ in range(8):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(PREFACE)
            idle.append(sock)
        await eventually_async(lambda: door.connections == 8, "8 relays")
        idle_sizes = list(_pipe_sizes(theirs).values())
        busy = socket.create_connection(("127.0.0.1", port))
        busy.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(busy, PREFACE + (8 * MiB).to_bytes(8, "big"))
        got = bytearray()
        while len(got) < 8 * MiB:
            got += await loop.sock_recv(busy, 1 << 16)
        await asyncio.sleep(0.2)  # the answers done: the pipe drained and idle
        after = list(_pipe_sizes(theirs).values())
        whole = bytes(got) == bytes(i % 251 for i in range(8 * MiB))
        for sock in [*idle, busy]:
            sock.close()
        await door.close()
        backend.close()
        return idle_sizes, after, whole

    idle_sizes, after, whole = asyncio.run(go())
    assert whole
    assert len(idle_sizes) == 8 * 4 and set(idle_sizes) == {PIPE_IDLE_BYTES}
    assert PIPE_BYTES in sized  # grown while the answers came (root: never refused)
    assert sized[-1] == PIPE_IDLE_BYTES and set(after) == {PIPE_IDLE_BYTES}
