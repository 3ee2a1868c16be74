"""Wire compatibility with torch, both ways, for the FIFO and the queue variants."""

from __future__ import annotations

import multiprocessing as mp
import signal
import time

import pytest

from harness.timer import LocalTimerClient, LocalTimerServer

from .conftest import alive, read_line

KILL = -int(signal.SIGKILL)
ctx = mp.get_context("fork")


def test_torch_file_client_against_our_server(file_server, children, expiries):
    # torch's own configure/expires/FileTimerClient in the worker
    worker = children.worker("torch-hang", file_server.file_path, 0.5)
    assert read_line(worker, timeout=30) == "acquired"
    assert worker.wait(5) == KILL
    expiry = expiries.next()
    # torch's release of "released" was honoured: only "hang" expired
    assert (expiry.worker_id, expiry.scope_ids) == (worker.pid, ("hang",))
    assert file_server.is_alive()


def test_our_file_client_against_torchs_server(tmp_path, children):
    path = str(tmp_path / "torch.fifo")
    server = children.worker("torch-serve", path)
    assert read_line(server, timeout=30) == "ready"
    calm = children.worker("release", path, 0.2)
    assert read_line(calm) == "released"
    hang = children.worker("hang", path, 0.6)
    assert read_line(hang) == "acquired"
    assert hang.wait(10) == KILL
    assert alive(calm)  # our release reached torch's server
    if _torch_server_kills_itself():  # then SIGKILLs its own process (baseline e8); ours never does
        assert server.wait(10) == KILL
    else:
        time.sleep(0.5)  # a few of its watchdog's rounds after the expiry
        assert alive(server)


def _torch_server_kills_itself() -> bool:
    """Whether this torch's ``FileTimerServer`` ends its own process after it reaped an
    expired worker (torch 2.13's does; torch 2.4's reaps the worker and goes on)."""
    import inspect

    from torch.distributed.elastic.timer import FileTimerServer

    return "os.getpid()" in inspect.getsource(FileTimerServer._run_watchdog)


def _torch_client_worker(q, after, ready):
    import torch.distributed.elastic.timer as timer

    timer.configure(timer.LocalTimerClient(q))
    with timer.expires(after=after, scope="torch-hang"):
        ready.set()
        time.sleep(60)


def _our_client_worker(q, after, ready):
    import harness.timer as timer

    timer.configure(LocalTimerClient(q))
    with timer.expires(after=0.1, scope="released"):
        pass
    with timer.expires(after=after, scope="hang"):
        ready.set()
        time.sleep(60)


@pytest.fixture
def mpq():
    q = ctx.Queue()
    yield q
    q.close()
    q.join_thread()


def _run(target, q, after):
    ready = ctx.Event()
    p = ctx.Process(target=target, args=(q, after, ready), daemon=True)
    p.start()
    try:
        assert ready.wait(10)
        p.join(5)
        return p.exitcode
    finally:
        if p.is_alive():
            p.kill()
        p.join(5)


def test_torch_local_client_against_our_server(mpq, expiries):
    pytest.importorskip("torch.distributed.elastic.timer")
    server = LocalTimerServer(mpq, on_expired=expiries)
    server.start()
    try:
        assert _run(_torch_client_worker, mpq, 0.3) == KILL
        assert expiries.next().scope_ids == ("torch-hang",)
    finally:
        server.stop()


def test_our_local_client_against_torchs_server(mpq):
    from torch.distributed.elastic.timer import LocalTimerServer as TorchServer

    server = TorchServer(mpq, max_interval=0.1)
    server.start()
    try:
        assert _run(_our_client_worker, mpq, 0.4) == KILL
    finally:
        server.stop()
