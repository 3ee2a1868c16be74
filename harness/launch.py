"""``LaunchConfig`` and ``elastic_launch``: run one node's agent from Python.

Public runtime API (re-exported by ``harness.run``, torchrun's home for them; pinned by
``tests/unit/test_exports.py``): the simulation starts every node agent through
``run_agent``, exactly as ``elastic-run`` does (docs/architecture.md, "The life of a job").
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.agent import (
    DEFAULT_MAX_RESTARTS,
    DEFAULT_MONITOR_INTERVAL,
    MAX_RESTARTS_RULE,
    MONITOR_INTERVAL_RULE,
    LocalElasticAgent,
    RunResult,
    WorkerSpec,
)
from harness.errors import ChildFailedError, ConfigError, SignalException
from harness.procs import LogsSpecs
from harness.rendezvous import RendezvousParameters, get_rendezvous_handler

__all__ = ["LaunchConfig", "build_agent", "elastic_launch", "launch_agent", "run_agent"]

log = logging.getLogger(__name__)

#: seconds a stopping worker gets before SIGKILL (torch's; ``Cluster(shutdown_timeout=)``)
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"


@dataclass
class LaunchConfig:
    """Everything one node's agent needs; same fields and defaults as torch's."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    logs_specs: LogsSpecs | None = None
    run_id: str = ""
    role: str = "default_role"
    rdzv_endpoint: str = ""
    rdzv_backend: str = "etcd"
    rdzv_configs: dict[str, Any] = field(default_factory=dict)
    rdzv_timeout: int = -1
    max_restarts: int = DEFAULT_MAX_RESTARTS
    monitor_interval: float = DEFAULT_MONITOR_INTERVAL
    start_method: str = "spawn"
    log_line_prefix_template: str | None = None
    metrics_cfg: dict[str, str] = field(default_factory=dict)
    local_addr: str | None = None
    event_log_handler: str = "null"
    signals_to_handle: str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    virtual_local_rank: bool = False
    shutdown_timeout: float | None = None
    exit_barrier_timeout: float = 300
    node_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.min_nodes, int) or self.min_nodes < 1:
            raise ConfigError("min_nodes", self.min_nodes, "must be an int >= 1", "--nnodes")
        if not isinstance(self.max_nodes, int) or self.max_nodes < self.min_nodes:
            raise ConfigError("max_nodes", self.max_nodes,
                              f"must be >= min_nodes={self.min_nodes}", "--nnodes")
        if not isinstance(self.nproc_per_node, int) or self.nproc_per_node < 1:
            raise ConfigError("nproc_per_node", self.nproc_per_node, "must be >= 1",
                              "--nproc-per-node")
        MAX_RESTARTS_RULE.check(self.max_restarts, "--max-restarts")
        MONITOR_INTERVAL_RULE.check(self.monitor_interval, "--monitor-interval")
        if not self.exit_barrier_timeout >= 0:  # not `< 0`: nan passed that
            raise ConfigError("exit_barrier_timeout", self.exit_barrier_timeout, "must be >= 0",
                              "--exit-barrier-timeout")
        default_timeout = 900
        if self.rdzv_timeout != -1:
            default_timeout = self.rdzv_timeout
        self.rdzv_configs.setdefault("timeout", default_timeout)
        if self.shutdown_timeout is None:
            raw = os.environ.get(SHUTDOWN_TIMEOUT_ENV, "30")
            try:
                self.shutdown_timeout = float(raw)
            except ValueError:
                raise ConfigError(SHUTDOWN_TIMEOUT_ENV, raw, "must be a number of seconds") from None
        if not self.shutdown_timeout >= 0:  # nan too
            raise ConfigError("shutdown_timeout", self.shutdown_timeout, "must be >= 0",
                              "--shutdown-timeout")
        if self.logs_specs is None:
            self.logs_specs = LogsSpecs()


class elastic_launch:
    """``elastic_launch(config, entrypoint)(*args)`` -> ``{global_rank: return value}``."""

    def __init__(self, config: LaunchConfig, entrypoint: Callable[..., Any] | str | None):
        self._config = config
        self._entrypoint = entrypoint

    def __call__(self, *args: Any) -> dict[int, Any]:
        return launch_agent(self._config, self._entrypoint, list(args))


def _entrypoint_name(entrypoint: Callable[..., Any] | str | None, args: list[Any]) -> str:
    """What the report calls the job: the script for ``python script.py``."""
    if isinstance(entrypoint, str):
        if os.path.basename(entrypoint).startswith("python"):
            for arg in args:
                if isinstance(arg, str) and not arg.startswith("-"):
                    return arg
        return entrypoint
    return getattr(entrypoint, "__qualname__", "") or repr(entrypoint)


def build_agent(config: LaunchConfig, entrypoint: Callable[..., Any] | str | None,
                args: list[Any]) -> LocalElasticAgent:
    """Create the rendezvous handler, spec and agent for ``config``."""
    if not config.run_id:
        config.run_id = str(uuid.uuid4().int)
    params = RendezvousParameters(
        backend=config.rdzv_backend, endpoint=config.rdzv_endpoint, run_id=config.run_id,
        min_nodes=config.min_nodes, max_nodes=config.max_nodes,
        local_addr=config.local_addr, **config.rdzv_configs,
    )
    handler = get_rendezvous_handler(params)
    spec = WorkerSpec(
        role=config.role, local_world_size=config.nproc_per_node, entrypoint=entrypoint,
        args=tuple(args), rdzv_handler=handler, max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval, local_addr=config.local_addr,
        event_log_handler=config.event_log_handler, virtual_local_rank=config.virtual_local_rank,
    )
    return LocalElasticAgent(
        spec=spec, logs_specs=config.logs_specs, start_method=config.start_method,
        exit_barrier_timeout=config.exit_barrier_timeout,
        log_line_prefix_template=config.log_line_prefix_template,
        shutdown_timeout=float(config.shutdown_timeout or 0), node_name=config.node_name,
        signals_to_handle=config.signals_to_handle,
    )


def launch_agent(config: LaunchConfig, entrypoint: Callable[..., Any] | str | None,
                 args: list[Any]) -> dict[int, Any]:
    """Run one node's agent to the end; raise ``ChildFailedError`` if the workers failed."""
    result = run_agent(config, entrypoint, args)
    if result.is_failed():
        raise ChildFailedError(name=_entrypoint_name(entrypoint, args), failures=result.failures)
    return result.return_values


def run_agent(config: LaunchConfig, entrypoint: Callable[..., Any] | str | None,
              args: list[Any]) -> RunResult:
    """Like ``launch_agent`` but returns the ``RunResult`` instead of raising."""
    agent = build_agent(config, entrypoint, args)
    handler = agent.get_worker_group().spec.rdzv_handler
    try:
        return agent.run()
    except SignalException:
        handler.leave()  # a stopped node leaves; the others carry on without it
        raise
    finally:
        handler.shutdown()
