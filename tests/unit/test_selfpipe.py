"""``harness.selfpipe``: the one self-pipe every select loop of the project wakes on."""

from __future__ import annotations

import os
import select

from harness.selfpipe import drain_pipe, self_pipe, wake_pipe


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_a_drain_empties_every_wake_up_so_select_no_longer_fires():
    r, w = self_pipe()
    try:
        assert not os.get_blocking(r) and not os.get_blocking(w)
        assert not os.get_inheritable(r) and not os.get_inheritable(w)
        for _ in range(10_000):  # more than one read's worth
            os.write(w, b"!")
        assert readable(r)
        drain_pipe(r)
        assert not readable(r)
        drain_pipe(r)  # an empty pipe: returns at once
    finally:
        os.close(r)
        os.close(w)


def test_a_full_pipe_takes_no_more_wake_ups_and_blocks_nobody():
    r, w = self_pipe()
    try:
        while True:
            try:
                os.write(w, b"x" * 65536)
            except BlockingIOError:
                break
        wake_pipe(w)  # full: ignored, the reader is due to wake anyway
        drain_pipe(r)
        assert not readable(r)
    finally:
        os.close(r)
        os.close(w)


def test_a_pipe_closed_under_a_racing_close_is_drained_and_woken_quietly():
    r, w = self_pipe()
    os.write(w, b"!")
    os.close(r)
    os.close(w)
    drain_pipe(r)  # EBADF: nothing left to drain
    wake_pipe(w)
