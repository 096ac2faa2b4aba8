"""A receive thread's buffer (spoke.hublink.receive.Buffers) grows for a larger block and
stays usable: a spoke that read a 3 MiB file first and a 4.8 MiB one next failed every
later block with "mmap closed or invalid" until this was fixed."""

from __future__ import annotations

import mmap

from spoke.hublink.receive import Buffers


def test_a_larger_block_after_a_smaller_one_gets_a_usable_buffer() -> None:
    buffers = Buffers()
    first = buffers.get(3_158_073)
    first[:5] = b"first"
    held = bytes(first[:5])
    for size in (3_170_418, 5_033_165, 100, 4 << 20, 9 << 20):
        view = buffers.get(size)
        assert len(view) == size
        view[-3:] = b"end"  # writable to its last byte
        assert bytes(view[-3:]) == b"end"
    assert held == b"first"
    assert len(buffers.get(1)) == 1


def test_the_buffer_is_page_aligned_for_o_direct_and_reused() -> None:
    buffers = Buffers()
    a = buffers.get(70_000)
    b = buffers.get(60_000)  # fits: the same buffer
    assert a.obj is b.obj
    assert len(a.obj) % mmap.PAGESIZE == 0
