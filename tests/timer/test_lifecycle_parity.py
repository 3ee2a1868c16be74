"""Lifecycle corners where code written against torch's timers must behave the same here."""

from __future__ import annotations

import multiprocessing as mp

import pytest

import harness.timer as ours

ctx = mp.get_context("spawn")


@pytest.fixture(params=["torch", "ours"])
def timer_module(request):
    if request.param == "torch":
        import torch.distributed.elastic.timer as theirs

        yield theirs
        theirs.configure(None)
    else:
        yield ours
        ours.configure(None)


def test_configure_none_then_expires_raises_runtime_error(timer_module):
    timer_module.configure(None)
    with pytest.raises(RuntimeError, match="Configure timer client"):
        with timer_module.expires(after=1):
            pass


def test_local_server_starts_twice_and_again_after_stop(timer_module):
    queue = ctx.Queue()
    server = timer_module.LocalTimerServer(queue, max_interval=0.01)
    server.start()
    server.start()  # torch: accepted
    server.stop()
    server.start()  # torch: a stopped server can be started again
    timer_module.configure(timer_module.LocalTimerClient(queue))
    with timer_module.expires(after=60):  # the restarted server serves requests
        pass
    server.stop()
