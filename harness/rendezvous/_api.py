"""The rendezvous handler interface, its parameters, results and errors (the backend
registry is ``_registry``: it names the backends, this module names none of them)."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from harness.errors import ConfigError, ElasticError

__all__ = [
    "HEARTBEAT_TIMEOUT",
    "KEEP_ALIVE_INTERVAL",
    "MAX_LEASE_FACTOR",
    "RendezvousError",
    "RendezvousClosedError",
    "RendezvousTimeoutError",
    "RendezvousConnectionError",
    "RendezvousStateError",
    "RendezvousGracefulExitError",
    "RendezvousRoundAbandonedError",
    "RendezvousStoreInfo",
    "RendezvousInfo",
    "RendezvousHandler",
    "RendezvousParameters",
]

#: a node's lease may grow to this many times ``heartbeat_timeout`` on a loaded host, unless
#: ``--rdzv-conf max_lease`` says otherwise (``_liveness.KeepAliveLease``); the simulation's
#: fencing invariant allows that long
MAX_LEASE_FACTOR = 5.0
#: the dynamic rendezvous's keep-alive: each node bumps its heartbeat this often (s) ...
KEEP_ALIVE_INTERVAL = 0.1
#: ... and is judged silent after this long without one (s); ``--rdzv-conf`` sets both
HEARTBEAT_TIMEOUT = 0.8


class RendezvousError(ElasticError, RuntimeError):
    """Base of rendezvous failures (a ``RuntimeError`` too: torch raises that where a
    registry hands back a handler for another backend)."""


class RendezvousClosedError(RendezvousError):
    """The rendezvous is closed: the job is over (or being torn down)."""


class RendezvousTimeoutError(RendezvousError):
    """The rendezvous did not complete in time."""


class RendezvousConnectionError(RendezvousError):
    """The rendezvous backend (store, etcd) cannot be reached."""


class RendezvousStateError(RendezvousError):
    """The rendezvous state is corrupt or was written by something else."""


class RendezvousRoundAbandonedError(RendezvousError):
    """The round this node just completed ended before the node could run it: a member was
    lost, a newer round began, or the store stopped answering while the agent waited in it
    (for its ranks). The round is over, not the job: join the next one."""


class RendezvousGracefulExitError(RendezvousError):
    """This node is not needed (surplus); it should exit cleanly."""


@dataclass(frozen=True)
class RendezvousStoreInfo:
    """Where rank 0's workers host the torch.distributed store (MASTER_ADDR/MASTER_PORT)."""

    master_addr: str
    master_port: int
    use_agent_store: bool = False


@dataclass
class RendezvousInfo:
    """The outcome of one rendezvous round for this node.

    ``restart_count``: the job's restart count in this round, the same for every node of
    it (the agent gives it to its workers as ``TORCHELASTIC_RESTART_COUNT`` and enforces
    ``max_restarts`` against it). None: the handler keeps no count for the job, and the
    agent counts its own failures, as torch's agents do (pytorch#108158)."""

    store: Any
    rank: int
    world_size: int
    bootstrap_store_info: RendezvousStoreInfo
    round: int = 0
    restart_count: int | None = None


class RendezvousHandler(abc.ABC):
    """What an agent needs from a rendezvous backend."""

    @abc.abstractmethod
    def get_backend(self) -> str: ...

    @property
    def use_agent_store(self) -> bool:
        return False

    @abc.abstractmethod
    def next_rendezvous(self) -> RendezvousInfo:
        """Block until a round completes; return this node's rank and the world size."""

    @abc.abstractmethod
    def is_closed(self) -> bool: ...

    @abc.abstractmethod
    def set_closed(self) -> None: ...

    @abc.abstractmethod
    def num_nodes_waiting(self) -> int:
        """Nodes that arrived after the current round closed (a reason to re-rendezvous)."""

    @abc.abstractmethod
    def get_run_id(self) -> str: ...

    def membership_changed(self, confirm: bool = False) -> bool:
        """True when the current round no longer matches the live membership (a node
        joined, left or died). The agent asks on every wake-up, with ``confirm=True``
        right after it sees workers fail: a failure caused by a membership change
        restarts the group without using up ``max_restarts``, so then the answer must
        not rest on news older than the failure. May block briefly (bounded) to confirm
        a suspected loss or get fresh news."""
        return self.num_nodes_waiting() > 0

    def charge_restart(self) -> None:
        """The workers of the round this node runs failed on their own (not because the
        membership changed) and the agent restarts them: the next round's
        ``RendezvousInfo.restart_count`` is at least this round's plus one. Every node
        that saw the same failure may call it; the job counts it once. Default: nothing
        (a handler that returns no ``restart_count`` needs no charge)."""

    def event_fd(self) -> int | None:
        """A descriptor that turns readable when membership news arrives, so the agent
        wakes at once instead of at its next ``monitor_interval`` tick. None: no such fd."""
        return None

    def leave(self) -> None:
        """This node is going away but the job is not over (the agent was stopped by a
        signal): drop it from the membership now so the others re-rendezvous at once,
        without closing the rendezvous. ``shutdown()`` follows. Default: nothing."""

    def shutdown(self) -> bool:
        """Release resources; True if the handler shut down cleanly. Unless ``leave()``
        was called first, multi-node backends also close the rendezvous (the job is over)."""
        return True


class RendezvousParameters:
    """Backend-independent rendezvous settings; ``config`` holds backend extras."""

    def __init__(
        self,
        backend: str,
        endpoint: str,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None = None,
        **kwargs: Any,
    ):
        if not backend:
            raise ConfigError("rdzv_backend", backend, "must be a non-empty string")
        if not isinstance(min_nodes, int) or min_nodes < 1:
            raise ConfigError("min_nodes", min_nodes, "must be an int >= 1", "--nnodes")
        if not isinstance(max_nodes, int) or max_nodes < min_nodes:
            raise ConfigError("max_nodes", max_nodes, f"must be >= min_nodes={min_nodes}", "--nnodes")
        self.backend = backend
        self.endpoint = endpoint
        self.run_id = run_id
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.local_addr = local_addr
        self.config = kwargs

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)

    def get_as_bool(self, key: str, default: bool | None = None) -> bool | None:
        value = self.get(key, default)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):  # torch: only 1 and 0 (2 or -1 is a typo, not True)
            if value in (0, 1):
                return value == 1
            raise ConfigError(key, value, "must be a boolean (true/false/1/0)", "--rdzv-conf")
        text = str(value).strip().lower()
        if text in ("1", "true", "t", "yes", "y"):
            return True
        if text in ("0", "false", "f", "no", "n"):
            return False
        raise ConfigError(key, value, "must be a boolean (true/false/1/0)", "--rdzv-conf")

    def get_as_int(self, key: str, default: int | None = None) -> int | None:
        value = self.get(key, default)
        if value is None:
            return None
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(key, value, "must be an integer", "--rdzv-conf") from None

    def get_as_float(self, key: str, default: float | None = None) -> float | None:
        value = self.get(key, default)
        if value is None:
            return None
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(key, value, "must be a number", "--rdzv-conf") from None

    def __repr__(self) -> str:
        return (
            f"RendezvousParameters(backend={self.backend!r}, endpoint={self.endpoint!r}, "
            f"run_id={self.run_id!r}, min_nodes={self.min_nodes}, max_nodes={self.max_nodes})"
        )
