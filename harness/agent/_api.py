"""The agent's data model: worker specs, workers, groups, states and run results."""

from __future__ import annotations

import abc
import json
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.errors import ConfigError, ProcessFailure
from harness.settings import DEFAULT_MAX_RESTARTS, DEFAULT_MONITOR_INTERVAL, MAX_RESTARTS_RULE, MONITOR_INTERVAL_RULE
from harness.states import WorkerState

__all__ = [
    "DEFAULT_MAX_RESTARTS",
    "DEFAULT_MONITOR_INTERVAL",
    "DEFAULT_ROLE",
    "WorkerSpec",
    "WorkerState",
    "Worker",
    "WorkerGroup",
    "RunResult",
    "ElasticAgent",
    "AgentEvent",
]

DEFAULT_ROLE = "default"


@dataclass
class WorkerSpec:
    """Blueprint of one role's workers; identical on every node.

    ``entrypoint`` is a callable (run in a child process) or a program path/name
    (a binary, run with ``args``). ``fn`` is the deprecated spelling of a callable.
    """

    role: str
    local_world_size: int
    rdzv_handler: Any
    fn: Callable[..., Any] | None = None
    entrypoint: Callable[..., Any] | str | None = None
    args: tuple[Any, ...] = ()
    max_restarts: int = DEFAULT_MAX_RESTARTS
    monitor_interval: float = DEFAULT_MONITOR_INTERVAL
    master_port: int | None = None
    master_addr: str | None = None
    local_addr: str | None = None
    event_log_handler: str = "null"
    virtual_local_rank: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.role, str) or not self.role:
            raise ConfigError("role", self.role, "must be a non-empty string")
        if not isinstance(self.local_world_size, int) or self.local_world_size < 1:
            raise ConfigError("local_world_size", self.local_world_size, "must be an int >= 1")
        MAX_RESTARTS_RULE.check(self.max_restarts)
        MONITOR_INTERVAL_RULE.check(self.monitor_interval)
        if self.master_port is not None and not 0 <= self.master_port < 65536:
            raise ConfigError("master_port", self.master_port, "must be in 0..65535")
        if self.fn is not None:
            if self.entrypoint is not None:
                raise ConfigError("fn", self.fn, "cannot be given together with entrypoint")
            self.entrypoint = self.fn
        if self.entrypoint is None:
            raise ConfigError("entrypoint", None, "must be a callable or a program name")
        if not (callable(self.entrypoint) or isinstance(self.entrypoint, str)):
            raise ConfigError("entrypoint", self.entrypoint, "must be a callable or a str")
        if not isinstance(self.args, tuple):
            raise ConfigError("args", self.args, "must be a tuple")

    def get_entrypoint_name(self) -> str:
        """The program name for binaries, the function's ``__qualname__`` for callables."""
        if isinstance(self.entrypoint, str):
            return self.entrypoint
        return getattr(self.entrypoint, "__qualname__", repr(self.entrypoint))


@dataclass
class Worker:
    """One worker instance; ``id`` is the pid for local agents."""

    local_rank: int
    global_rank: int = -1
    role_rank: int = -1
    world_size: int = -1
    role_world_size: int = -1
    id: Any = None

    def __repr__(self) -> str:
        return (
            f"Worker(local_rank={self.local_rank}, global_rank={self.global_rank}, "
            f"role_rank={self.role_rank}, world_size={self.world_size}, "
            f"role_world_size={self.role_world_size}, id={self.id})"
        )


class WorkerGroup:
    """The workers of one spec on this node, with the facts of the current round."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.workers = [Worker(local_rank=i) for i in range(spec.local_world_size)]
        self.store: Any = None
        self.group_rank: int | None = None
        self.group_world_size: int | None = None
        self.master_addr: str | None = None
        self.master_port: int | None = None
        self.state = WorkerState.INIT

    def __repr__(self) -> str:
        return (
            f"WorkerGroup(role={self.spec.role!r}, state={self.state.value}, "
            f"group_rank={self.group_rank}, group_world_size={self.group_world_size}, "
            f"workers={len(self.workers)})"
        )


@dataclass
class RunResult:
    """Outcome of ``agent.run()``: values and failures keyed by *global* rank.

    Workers the agent stopped on purpose (peers of a failed worker) are in neither map.
    """

    state: WorkerState
    return_values: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, ProcessFailure] = field(default_factory=dict)

    def is_failed(self) -> bool:
        return self.state == WorkerState.FAILED

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "return_values": {str(k): _jsonable(v) for k, v in self.return_values.items()},
            "failures": {str(k): f.to_json() for k, f in self.failures.items()},
        }


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


class ElasticAgent(abc.ABC):
    """An agent runs and supervises the workers of one node."""

    @abc.abstractmethod
    def run(self, role: str = DEFAULT_ROLE) -> RunResult:
        """Run the workers, restarting on failure up to ``max_restarts``."""

    @abc.abstractmethod
    def get_worker_group(self, role: str = DEFAULT_ROLE) -> WorkerGroup:
        """The (mutable) worker group of ``role``."""


@dataclass
class AgentEvent:
    """torch's ``events.Event`` shape for the agent's final status (``get_event_succeeded``
    / ``get_event_failed``): ``source`` is the plain string torch's str-enum compares equal
    to, so no torch import is needed to build or read one."""

    name: str
    source: str
    timestamp: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def for_group(cls, group: WorkerGroup, state: str, total_run_time: float, restarts: int,
                  raw_error: str | None = None) -> AgentEvent:
        """The metadata torch's ``SimpleElasticAgent._construct_event`` records for the agent."""
        spec = group.spec
        metadata = {
            "run_id": spec.rdzv_handler.get_run_id(), "global_rank": None,
            "group_rank": group.group_rank, "worker_id": None, "role": spec.role,
            "hostname": socket.getfqdn(), "state": state, "total_run_time": int(total_run_time),
            "rdzv_backend": spec.rdzv_handler.get_backend(), "raw_error": raw_error,
            "metadata": json.dumps({"group_world_size": group.group_world_size,
                                    "entry_point": spec.get_entrypoint_name()}),
            "agent_restarts": restarts, "duration_ms": None,
        }
        return cls(f"torchelastic.worker.status.{state}", "AGENT", int(time.time() * 1000), metadata)

    def serialize(self) -> str:
        return json.dumps(asdict(self))
