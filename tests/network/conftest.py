"""Network tests build real namespaces; without root, ``ip``/``tc``/``nft`` they skip, saying why."""

from __future__ import annotations

import os

import pytest

from harness.sim.net import Network, netns_missing
from harness.sim.net.names import NETNS_DIR


def our_namespaces() -> set[str]:
    """Namespaces named by this process (never compare other processes' ones)."""
    try:
        return {n for n in os.listdir(NETNS_DIR) if n.startswith(f"pe{os.getpid()}-")}
    except FileNotFoundError:
        return set()


@pytest.fixture
def needs_netns() -> None:
    missing = netns_missing()
    if missing:
        pytest.skip(f"network namespaces unavailable: needs {'; '.join(missing)}")


@pytest.fixture
def net(needs_netns: None):
    """Three nodes and a store on a bridge; removed even when the test fails."""
    network = Network(3, "netns")
    try:
        yield network
    finally:
        network.close()
    assert not our_namespaces(), "the network left namespaces behind"
