"""A dynamic rendezvous handler opens nothing until it is used: constructing one (what
``build_agent`` does before the agent runs) binds no socket, hosts no store and starts no
thread; ``next_rendezvous`` does all of it. Constructed and dropped, it leaks nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

from harness.rendezvous import RendezvousParameters, get_rendezvous_handler


def own_sockets() -> set[str]:
    """The sockets this process holds (``socket:[inode]`` links under /proc/self/fd)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_constructing_a_handler_binds_nothing_and_starts_no_thread():
    port = free_port()
    params = RendezvousParameters("c10d", f"127.0.0.1:{port}", "lazy", 1, 2, is_host=True,
                                  last_call_timeout=0.1)
    threads, sockets = set(threading.enumerate()), own_sockets()
    handler = get_rendezvous_handler(params)
    try:
        assert set(threading.enumerate()) == threads
        assert own_sockets() == sockets
        assert not listening(port)  # the store is not hosted yet
        assert handler.event_fd() is None and not handler.membership_changed()

        info = handler.next_rendezvous()  # first use: host the store, bind, keep alive
        assert (info.rank, info.world_size) == (0, 1)
        assert listening(port)
        assert any(t.name.startswith("rdzv-keeper:") for t in threading.enumerate())
        assert handler.event_fd() is not None
    finally:
        assert handler.shutdown()
    assert not listening(port)
    assert not any(t.name.startswith("rdzv-keeper:") for t in threading.enumerate())


def test_a_handler_whose_store_cannot_be_opened_fails_on_use_and_shuts_down_quietly():
    """The error a constructor used to raise now comes from the first use, once; the
    launcher's ``shutdown()`` then closes nothing (and does not try the store again)."""
    port = free_port()  # nobody listens, and this node may not host it
    params = RendezvousParameters("c10d", f"127.0.0.1:{port}", "nostore", 1, 2, is_host=False,
                                  read_timeout=0.5)
    handler = get_rendezvous_handler(params)
    sockets = own_sockets()
    try:
        handler.next_rendezvous()
    except Exception as e:  # the store's own error: refused
        first = e
    else:
        raise AssertionError("next_rendezvous reached a store that is not there")
    assert "127.0.0.1" in str(first)
    assert handler.shutdown() is False
    assert own_sockets() <= sockets
    assert not any(t.name.startswith("rdzv-keeper:") for t in threading.enumerate())


IMPORT_BACKEND_PROBE = """
import json, socket, sys
from harness.errors import ConfigError
from harness.rendezvous import RendezvousParameters, get_rendezvous_handler, import_backend

def harness_modules():
    return {m for m in sys.modules if m.startswith("harness.")}

before = harness_modules()
import_backend("static")  # nothing to load
static = harness_modules() - before
import_backend("c10d")
loaded = harness_modules() - before
try:
    import_backend("nope")
    unknown = ""
except ConfigError as e:
    unknown = str(e)
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
handler = get_rendezvous_handler(RendezvousParameters("c10d", f"127.0.0.1:{port}", "preload", 1, 2,
                                                      is_host=True, last_call_timeout=0.1))
preloaded = harness_modules()
info = handler.next_rendezvous()
from harness.rendezvous._barrier import store_barrier
store_barrier(info.store, 1, "exit/", 10.0)
handler.shutdown()
print(json.dumps({"static": sorted(static), "loaded": sorted(loaded), "unknown": unknown,
                  "first_round": sorted(harness_modules() - preloaded)}))
"""


def test_import_backend_loads_what_a_c10d_agents_first_round_would():
    """What a process that forks agents preloads: afterwards an agent's first round (its
    handler, the store, the exit barrier) imports no module of the runtime's."""
    out = subprocess.run([sys.executable, "-c", IMPORT_BACKEND_PROBE], capture_output=True, text=True,
                         timeout=60, check=True)
    found = json.loads(out.stdout.splitlines()[-1])
    assert found["static"] == []
    assert {"harness.rendezvous._c10d", "harness.rendezvous._barrier", "harness.rendezvous._keeper"} \
        <= set(found["loaded"])
    assert "'nope'" in found["unknown"] and "c10d" in found["unknown"]
    assert found["first_round"] == []
