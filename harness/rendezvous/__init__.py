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
    "get_rendezvous_handler",
    "rendezvous_handler_registry",
]
