"""Rendezvous: how the agents of a job find each other and agree on ranks."""

from harness.rendezvous._api import (
    MAX_LEASE_FACTOR,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)
from harness.rendezvous._registry import (
    RendezvousHandlerRegistry,
    get_rendezvous_handler,
    rendezvous_handler_registry,
)
from harness.rendezvous._store_auth import SECRET_ENV, SECRET_ENVS, SECRET_FILE_ENV

__all__ = [
    "MAX_LEASE_FACTOR",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousHandlerRegistry",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeoutError",
    "SECRET_ENV",
    "SECRET_ENVS",
    "SECRET_FILE_ENV",
    "get_rendezvous_handler",
    "rendezvous_handler_registry",
]
