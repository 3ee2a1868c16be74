"""Built-in backends, registered on first use (importing this module registers them)."""

from __future__ import annotations

from harness.endpoints import split_endpoint
from harness.errors import ConfigError
from harness.rendezvous._agent_store import agent_store_enabled
from harness.rendezvous._api import (
    RendezvousHandler,
    RendezvousParameters,
    rendezvous_handler_registry,
)
from harness.rendezvous._solo import SoloRendezvousHandler

C10D_DEFAULT_PORT = 29400


def _multi_node_pending(params: RendezvousParameters) -> RendezvousHandler:
    raise ConfigError(
        "nnodes", f"{params.min_nodes}:{params.max_nodes}",
        f"needs a multi-node rendezvous, which backend {params.backend!r} does not offer yet",
        "--nnodes",
    )


def _endpoint(params: RendezvousParameters, default_port: int) -> tuple[str, int]:
    """``host[:port]`` of ``params.endpoint``; a malformed one is a one-line ConfigError
    (a ValueError, as torch's) for every backend and node count."""
    try:
        return split_endpoint(params.endpoint, default_port)
    except ValueError as e:
        raise ConfigError("rdzv_endpoint", params.endpoint, str(e), "--rdzv-endpoint") from None


def _create_c10d(params: RendezvousParameters) -> RendezvousHandler:
    if params.max_nodes == 1:
        if params.endpoint.strip():
            _endpoint(params, C10D_DEFAULT_PORT)  # unused by one node, but a typo is a typo
        return SoloRendezvousHandler(params, "c10d", use_agent_store=agent_store_enabled())
    if not params.endpoint:
        raise ConfigError("rdzv_endpoint", params.endpoint,
                          "is required for a multi-node c10d rendezvous (host[:port])",
                          "--rdzv-endpoint")
    from harness.rendezvous._c10d import C10dRendezvousHandler

    return C10dRendezvousHandler(params)


def _create_static(params: RendezvousParameters) -> RendezvousHandler:
    addr, port = _endpoint(params, -1)  # as torch: the port is required (--master-port)
    if port == -1:
        raise ConfigError("rdzv_endpoint", params.endpoint, "has no port (add --master-port)",
                          "--rdzv-endpoint")
    if params.max_nodes == 1:
        return SoloRendezvousHandler(params, "static", master_addr=addr, master_port=port)
    return _multi_node_pending(params)


rendezvous_handler_registry.register("c10d", _create_c10d)
rendezvous_handler_registry.register("static", _create_static)
def _create_etcd(params: RendezvousParameters) -> RendezvousHandler:
    if not params.endpoint:
        raise ConfigError("rdzv_endpoint", params.endpoint,
                          "is required for the etcd rendezvous (etcd's host[:port])",
                          "--rdzv-endpoint")
    from harness.rendezvous._etcd import EtcdRendezvousHandler

    return EtcdRendezvousHandler(params, backend_name=params.backend)


rendezvous_handler_registry.register("etcd", _create_etcd)
rendezvous_handler_registry.register("etcd-v2", _create_etcd)
