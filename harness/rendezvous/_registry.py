"""The backend registry: one table names every built-in backend and how to create it.

The table is written out here, not filled in by backends registering themselves when they
are imported: a reader finds every backend in one place, importing a backend has no side
effect, and ``harness.rendezvous`` has no import cycle (``tests/unit/test_runtime_cycles.py``).
A creator imports its backend's module when called, so an agent on the single-node
handler never loads the c10d or etcd code. Users add their own backends with
``rendezvous_handler_registry.register`` (torch's API).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

from harness.endpoints import split_endpoint
from harness.errors import ConfigError
from harness.rendezvous._agent_store import agent_store_enabled
from harness.rendezvous._api import (
    RendezvousError,
    RendezvousHandler,
    RendezvousParameters,
)
from harness.rendezvous._solo import SoloRendezvousHandler
from harness.rendezvous._store import DEFAULT_PORT as C10D_DEFAULT_PORT

__all__ = ["BUILT_IN_BACKENDS", "C10D_DEFAULT_PORT", "HandlerCreator", "RendezvousHandlerRegistry",
           "get_rendezvous_handler", "import_backend", "rendezvous_handler_registry"]

HandlerCreator = Callable[[RendezvousParameters], RendezvousHandler]


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


def _create_etcd(params: RendezvousParameters) -> RendezvousHandler:
    if not params.endpoint:
        raise ConfigError("rdzv_endpoint", params.endpoint,
                          "is required for the etcd rendezvous (etcd's host[:port])",
                          "--rdzv-endpoint")
    from harness.rendezvous._etcd import EtcdRendezvousHandler

    return EtcdRendezvousHandler(params, backend_name=params.backend)


#: every built-in backend: name -> creator (``etcd-v2`` is torch's name for the same etcd)
BUILT_IN_BACKENDS: Mapping[str, HandlerCreator] = {
    "c10d": _create_c10d,
    "static": _create_static,
    "etcd": _create_etcd,
    "etcd-v2": _create_etcd,
}

#: the modules a multi-node agent on each built-in backend imports when it first needs them
#: (its handler's, and the exit barrier's): ``import_backend`` loads them ahead of time
_BACKEND_MODULES: Mapping[str, tuple[str, ...]] = {
    "c10d": ("harness.rendezvous._c10d", "harness.rendezvous._barrier"),
    "etcd": ("harness.rendezvous._etcd", "harness.rendezvous._barrier"),
    "etcd-v2": ("harness.rendezvous._etcd", "harness.rendezvous._barrier"),
}


def import_backend(backend: str) -> None:
    """Import the modules an agent on built-in ``backend`` loads on first use, now.

    Why: a process that forks many agents (the harness forks each simulated node from one
    interpreter) pays for those imports once instead of once per agent; ~10 ms of CPU an
    agent on c10d, which 128 agents on two cores feel. A backend with nothing to load
    (``static``, one registered by the user) is a no-op; an unknown name is a ``ConfigError``.
    """
    rendezvous_handler_registry.creator(backend)  # an unknown name: the registry's ConfigError
    for module in _BACKEND_MODULES.get(backend, ()):
        importlib.import_module(module)


#: backends whose handler reports another name (``get_backend()``) than the one asked for
_ALIASES = {"etcd-v2", "etcd"}


class RendezvousHandlerRegistry:
    """Backend name -> handler factory (torch's ``RendezvousHandlerRegistry``)."""

    def __init__(self, creators: Mapping[str, HandlerCreator] | None = None) -> None:
        self._creators: dict[str, HandlerCreator] = dict(creators or {})

    def register(self, backend: str, creator: HandlerCreator) -> None:
        existing = self._creators.get(backend)
        if existing is not None and existing is not creator:
            raise ValueError(f"rendezvous backend {backend!r} is already registered")
        self._creators[backend] = creator

    def names(self) -> list[str]:
        return sorted(self._creators)

    def creator(self, backend: str) -> HandlerCreator:
        """The factory registered for ``backend``; an unknown name is a one-line ``ConfigError``."""
        creator = self._creators.get(backend)
        if creator is None:
            raise ConfigError("rdzv_backend", backend, f"is not one of {', '.join(self.names())}",
                              "--rdzv-backend")
        return creator

    def create_handler(self, params: RendezvousParameters) -> RendezvousHandler:
        handler = self.creator(params.backend)(params)
        if handler.get_backend() != params.backend and params.backend not in _ALIASES:
            raise RendezvousError(
                f"backend {params.backend!r} created a handler for {handler.get_backend()!r}"
            )
        return handler


#: the process's registry: the built-ins, and whatever users register
rendezvous_handler_registry = RendezvousHandlerRegistry(BUILT_IN_BACKENDS)


def get_rendezvous_handler(params: RendezvousParameters) -> RendezvousHandler:
    """Create the handler for ``params.backend`` (built-ins: ``BUILT_IN_BACKENDS``)."""
    return rendezvous_handler_registry.create_handler(params)
