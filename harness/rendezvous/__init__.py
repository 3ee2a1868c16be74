"""Rendezvous: how the agents of a job find each other and agree on ranks."""

from collections.abc import Mapping

from harness.rendezvous._api import (
    HEARTBEAT_TIMEOUT,
    KEEP_ALIVE_INTERVAL,
    MAX_LEASE_FACTOR,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousRoundAbandonedError,
    RendezvousStateError,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)
from harness.rendezvous._registry import (
    RendezvousHandlerRegistry,
    get_rendezvous_handler,
    import_backend,
    rendezvous_handler_registry,
)
from harness.rendezvous._store_auth import SECRET_ENV, SECRET_ENVS, SECRET_FILE_ENV

__all__ = [
    "HEARTBEAT_TIMEOUT",
    "KEEP_ALIVE_INTERVAL",
    "MAX_LEASE_FACTOR",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousHandlerRegistry",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousRoundAbandonedError",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeoutError",
    "SECRET_ENV",
    "SECRET_ENVS",
    "SECRET_FILE_ENV",
    "enable_etcd_auth",
    "get_rendezvous_handler",
    "import_backend",
    "rendezvous_handler_registry",
]


def enable_etcd_auth(host: str, port: int, env: Mapping[str, str]) -> None:
    """Turn on authentication in the fresh etcd at ``host:port``: from then on only a node
    holding the job secret ``env`` names (``SECRET_FILE_ENV`` or ``SECRET_ENV``) reads or
    writes a key there. Imported when called: an agent on c10d never loads the etcd client."""
    from harness.rendezvous._etcd import enable_job_auth

    enable_job_auth(host, port, env)
