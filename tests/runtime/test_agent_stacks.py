"""An agent shows its Python stacks on SIGUSR1 when ``HARNESS_STACK_DUMP_DIR`` is set, as its
workers do: a node stuck with no live worker is stuck in its agent's own code, and the
harness names such a stall with that stack (``harness.sim.truth.stacks.agent_stacks``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from harness.procs import STACKS_ENV
from harness.rendezvous._store import StoreServer
from harness.sim.truth.stacks import worker_stacks
from tests.conftest import SCRIPTS
from tests.rendezvous.conftest import c10d_args


def test_an_agent_waiting_in_its_rendezvous_shows_where_and_a_sigterm_there_ends_it(tmp_path):
    server = StoreServer("127.0.0.1", 0).start()
    env = {**os.environ, STACKS_ENV: str(tmp_path)}
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    agent = subprocess.Popen(
        [sys.executable, "-m", "harness.run", *c10d_args(server.port, "2", "alone", "--rdzv-conf=is_host=false"),
         str(SCRIPTS / "sleeper.py")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        dump = tmp_path / f"{agent.pid}.txt"
        deadline = time.monotonic() + 30
        while not dump.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert dump.exists(), "the agent installed no stack dump handler"
        stacks = ""
        while "next_rendezvous" not in stacks and time.monotonic() < deadline:  # until it waits there
            stacks = worker_stacks([("agent", agent.pid)], str(tmp_path), wait=2.0)
        assert stacks.startswith("--- agent\n") and "next_rendezvous" in stacks, stacks
        agent.send_signal(signal.SIGTERM)  # in its rendezvous wait: it ends, not waits out a read timeout
        _, err = agent.communicate(timeout=20)
        assert agent.returncode != 0 and "stopped by SIGTERM" in err, err
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        server.stop()
