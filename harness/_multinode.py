"""Rendezvous settings for multi-node simulated jobs (store hosted by the harness or node 0)."""

from __future__ import annotations

from typing import Any

from harness.errors import ConfigError


def rendezvous_for(cluster: Any, job: Any) -> tuple[dict[str, Any], Any]:
    """(backend settings for every node, a store process to close or None)."""
    raise ConfigError("nnodes", f"{cluster.min_nodes}:{cluster.max_nodes}",
                      "needs the multi-node c10d rendezvous, which is not available yet")
