"""``elastic-run`` / ``python -m harness.run``: a torchrun-compatible launcher.

Every torchrun flag is accepted (dash and underscore spellings, same defaults, ``PET_*``
environment fallbacks). Differences, all on purpose: the agent never imports torch
for a single-node job, workers die with their agent, the restart grace is
``--shutdown-timeout`` (torch always uses 30 s), no temp dir is left behind, bad input is
a one-line error, and ``--start-method=zygote`` forks workers from a warm interpreter.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from harness.agent import DEFAULT_MONITOR_INTERVAL, MAX_RESTARTS_RULE, MONITOR_INTERVAL_RULE
from harness.errors import ERROR_FILE_ENV, ChildFailedError, ConfigError, ElasticError, SignalException
from harness.launch import LaunchConfig, elastic_launch, launch_agent

__all__ = [
    "LaunchConfig", "NnodesFormatError", "cli", "configure_logging", "config_from_args",
    "determine_local_world_size", "elastic_launch", "get_args_parser", "launch_agent", "main",
    "parse_args", "parse_min_max_nnodes", "run_script_path", "run_with_signal_handlers",
]

log = logging.getLogger("harness.run")

START_METHOD_CHOICES = ("spawn", "fork", "forkserver", "zygote")


# -- argparse actions with PET_* fallbacks (torch's ``env`` / ``check_env``) ------------


class _Env(argparse.Action):
    """Default from ``PET_<DEST>`` when set."""

    def __init__(self, dest: str, default: Any = None, required: bool = False, **kwargs: Any):
        env_value = os.environ.get(f"PET_{dest.upper()}")
        if env_value is not None:
            default, required = env_value, False
        super().__init__(dest=dest, default=default, required=required, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, values)


class _CheckEnv(argparse.Action):
    """A flag that ``PET_<DEST>=1`` also switches on."""

    def __init__(self, dest: str, default: bool = False, **kwargs: Any):
        env_value = os.environ.get(f"PET_{dest.upper()}")
        # isdecimal(), not isdigit(): PET_X="²" is a digit that int() refuses
        default = bool(int(env_value)) if env_value and env_value.isdecimal() else default
        super().__init__(dest=dest, const=True, default=default, nargs=0, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, self.const)


def _flag(parser: argparse.ArgumentParser, name: str, *extra: str, **kwargs: Any) -> None:
    """Register ``--a-b`` with its ``--a_b`` alias (torchrun accepts both)."""
    names = [*extra, f"--{name}"]
    if "-" in name:
        names.append(f"--{name.replace('-', '_')}")
    kwargs.setdefault("action", _Env)
    parser.add_argument(*names, dest=name.replace("-", "_"), **kwargs)


def _comma_list(text: str) -> list[str]:
    """``a,b`` -> [a, b]; ``,,`` escapes a literal comma (as torchrun)."""
    placeholder = "\x00"
    return [item.replace(placeholder, ",") for item in text.replace(",,", placeholder).split(",") if item]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (its usage block is 20; ``--help`` has it),
    with line breaks in what the user typed escaped (``unrecognized arguments`` quotes it raw)."""

    def error(self, message: str) -> NoReturn:
        flat = "\\n".join(message.splitlines())
        self.exit(2, f"{self.prog}: error: {flat} (see --help)\n")


def get_args_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="elastic-run",
        description="Elastic launcher for PyTorch training scripts (torchrun-compatible).",
    )
    _flag(parser, "nnodes", type=str, default="1:1", help="Nodes: N or MIN:MAX.")
    _flag(parser, "nproc-per-node", type=str, default="1",
          help="Workers per node: an int, 'cpu', 'gpu' or 'auto'.")
    _flag(parser, "rdzv-backend", type=str, default="static", help="c10d, static, etcd, etcd-v2.")
    _flag(parser, "rdzv-endpoint", type=str, default="", help="host[:port] of the backend.")
    _flag(parser, "rdzv-id", type=str, default="none", help="Job id shared by all nodes.")
    _flag(parser, "rdzv-conf", type=str, default="", help="Backend options k1=v1,k2=v2.")
    _flag(parser, "standalone", action=_CheckEnv, help="Single node: c10d on localhost:0.")
    _flag(parser, "max-restarts", type=int, default=0, help="Worker group restarts before failing.")
    _flag(parser, "monitor-interval", type=float, default=DEFAULT_MONITOR_INTERVAL,
          help="Seconds between the agent's looks at its workers (once they are healthy: "
               "max(this, 1)); exits and membership news are seen at once.")
    _flag(parser, "start-method", type=str, default="spawn", choices=START_METHOD_CHOICES,
          help="How callables/scripts are started; 'zygote' forks from a warm torch interpreter.")
    _flag(parser, "event-log-handler", type=str, default="null")
    _flag(parser, "role", type=str, default="default", help="Role of the workers.")
    _flag(parser, "module", "-m", action=_CheckEnv, help="Run the script as a module (python -m).")
    _flag(parser, "no-python", action=_CheckEnv, help="Run the script as a program, not with python.")
    _flag(parser, "run-path", action=_CheckEnv, help="Run the script with runpy.run_path in the worker.")
    _flag(parser, "log-dir", type=str, default=None, help="Base directory for worker logs.")
    _flag(parser, "redirects", "-r", type=str, default="0", help="Redirect streams to files: 0-3 or 0:3,1:0.")
    _flag(parser, "tee", "-t", type=str, default="0", help="Tee streams to files and console: 0-3 or 0:3,1:0.")
    _flag(parser, "local-ranks-filter", type=str, default="", help="Only show these local ranks' console output.")
    _flag(parser, "duplicate-stdout-filters", type=_comma_list, default=[])
    _flag(parser, "duplicate-stderr-filters", type=_comma_list, default=[])
    _flag(parser, "node-rank", type=int, default=0, help="Node rank (static backend).")
    _flag(parser, "master-addr", type=str, default="127.0.0.1", help="Master address (static backend).")
    _flag(parser, "master-port", type=int, default=None, help="Master port (static backend).")
    _flag(parser, "local-addr", type=str, default=None, help="This node's address.")
    _flag(parser, "logs-specs", type=str, default=None, action="store")
    _flag(parser, "numa-binding", type=str, default=None, action="store",
          choices=["node", "socket", "exclusive", "core-complex"])
    _flag(parser, "signals-to-handle", type=str, default="SIGTERM,SIGINT,SIGHUP,SIGQUIT")
    _flag(parser, "shutdown-timeout", type=float, default=None,
          help="Grace (s) between SIGTERM and SIGKILL when stopping workers (also on restart).")
    _flag(parser, "virtual-local-rank", action=_CheckEnv)
    _flag(parser, "exit-barrier-timeout", type=float, default=300.0,
          help="Seconds to wait for other nodes after success (not in torchrun).")
    parser.add_argument("training_script", type=str, help="Script, module or program to run.")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    return get_args_parser().parse_args(argv)


# -- args -> LaunchConfig ---------------------------------------------------------------


def parse_min_max_nnodes(nnodes: str) -> tuple[int, int]:
    parts = str(nnodes).split(":")
    try:
        if len(parts) == 1:
            low = high = int(parts[0])
        elif len(parts) == 2:
            low, high = int(parts[0]), int(parts[1])
        else:
            raise NnodesFormatError("nnodes", nnodes, "must be N or MIN:MAX with integers",
                                    "--nnodes")
    except ValueError as e:
        if isinstance(e, NnodesFormatError):
            raise
        raise ConfigError("nnodes", nnodes, "must be N or MIN:MAX with integers", "--nnodes") from None
    if low < 1:
        raise ConfigError("nnodes", nnodes, "must have MIN >= 1", "--nnodes")
    if high < low:
        raise ConfigError("nnodes", nnodes, "must have MIN <= MAX", "--nnodes")
    return low, high


def _cuda_device_count() -> int:
    """GPUs visible, importing torch only when an NVIDIA device node exists."""
    if not os.path.exists("/dev/nvidia0") and not os.path.exists("/dev/nvidiactl"):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def determine_local_world_size(value: str) -> int:
    text = str(value).strip()
    try:  # not isdigit(): "²" and "--5" pass it, then int() raises
        count: int | None = int(text)
    except ValueError:
        count = None
    if count is not None:
        if count < 1:
            raise ConfigError("nproc_per_node", count, "must be >= 1", "--nproc-per-node")
        return count
    if text == "cpu":
        return os.cpu_count() or 1
    if text in ("gpu", "auto"):
        gpus = _cuda_device_count()
        if gpus:
            return gpus
        if text == "gpu":
            raise ConfigError("nproc_per_node", text, "needs CUDA, which is not available",
                              "--nproc-per-node")
        return os.cpu_count() or 1
    raise ConfigError("nproc_per_node", text, "must be an int >= 1, 'cpu', 'gpu' or 'auto'",
                      "--nproc-per-node")


def _parse_rdzv_conf(text: str) -> dict[str, str]:
    configs: dict[str, str] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("rdzv_conf", text, "must be key=value pairs separated by commas",
                              "--rdzv-conf")
        configs[key.strip()] = value.strip()
    return configs


def _local_ranks_filter(text: str) -> frozenset[int] | None:
    if not text:
        return None
    try:
        ranks = frozenset(int(r) for r in text.split(","))
    except ValueError:
        raise ConfigError("local_ranks_filter", text, "must be comma-separated integers like 0,1,2",
                          "--local-ranks-filter") from None
    return ranks


LOGS_SPECS_GROUP = "torchrun.logs_specs"


def _logs_specs_class(name: str | None) -> Any:
    """``--logs-specs NAME``: the class torchrun would load from the ``torchrun.logs_specs``
    entry point NAME (built like torch's: log_dir, redirects, tee, local_ranks_filter);
    our ``LogsSpecs`` when no name is given."""
    from harness.procs import LogsSpecs

    if name is None:
        return LogsSpecs
    from importlib.metadata import entry_points

    found = entry_points(group=LOGS_SPECS_GROUP)
    if name not in found.names:
        known = ", ".join(sorted(found.names)) or "none installed"
        raise ConfigError("logs_specs", name, f"is not a {LOGS_SPECS_GROUP!r} entry point ({known})",
                          "--logs-specs")
    try:
        return found[name].load()
    except Exception as e:  # a broken plugin is the user's to fix: say which and why
        raise ConfigError("logs_specs", name, f"failed to load: {type(e).__name__}: {e}",
                          "--logs-specs") from None


def run_script_path(training_script: str, *training_script_args: str) -> None:
    """Run ``training_script`` in this interpreter as ``__main__`` (``--run-path``)."""
    import runpy

    sys.argv = [training_script, *training_script_args]
    runpy.run_path(training_script, run_name="__main__")


def _check_script(args: argparse.Namespace) -> None:
    script = args.training_script
    if args.module:
        import importlib.util

        sys.path.insert(0, os.getcwd())
        try:
            found = importlib.util.find_spec(script) is not None
        except (ImportError, ValueError):
            found = False
        finally:
            sys.path.pop(0)
        if not found:
            raise ConfigError("training_script", script, "is not an importable module", "--module")
    elif args.no_python:
        import shutil

        if not (os.path.isfile(script) and os.access(script, os.X_OK)) and shutil.which(script) is None:
            raise ConfigError("training_script", script, "is not an executable program", "--no-python")
    elif not os.path.isfile(script):
        raise ConfigError("training_script", script, "does not exist or is not a file")


def config_from_args(args: argparse.Namespace) -> tuple[Any, Callable[..., Any] | str, list[str]]:
    from harness.procs import LogsSpecs
    from harness.procs._std import parse_std

    if args.standalone:
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    elif args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None:
        if parse_min_max_nnodes(args.nnodes)[1] == 1:
            args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    min_nodes, max_nodes = parse_min_max_nnodes(args.nnodes)
    # LaunchConfig checks them too, with the same rule: here before any side effect
    MAX_RESTARTS_RULE.check(args.max_restarts, "--max-restarts")
    MONITOR_INTERVAL_RULE.check(args.monitor_interval, "--monitor-interval")
    if args.module and args.no_python:
        raise ConfigError("no_python", True, "cannot be combined with --module", "--no-python")
    nproc = determine_local_world_size(args.nproc_per_node)
    from harness.rendezvous import rendezvous_handler_registry

    if args.rdzv_backend not in rendezvous_handler_registry.names():
        raise ConfigError("rdzv_backend", args.rdzv_backend,
                          f"is not one of {', '.join(rendezvous_handler_registry.names())}",
                          "--rdzv-backend")
    _check_script(args)
    if "OMP_NUM_THREADS" not in os.environ and nproc > 1:
        log.warning("Setting OMP_NUM_THREADS=1 for each worker (set it yourself to tune).")
        os.environ["OMP_NUM_THREADS"] = "1"
    rdzv_configs: dict[str, Any] = _parse_rdzv_conf(args.rdzv_conf)
    if args.rdzv_backend == "static":
        rdzv_configs["rank"] = args.node_rank
    endpoint = args.rdzv_endpoint
    if args.rdzv_backend == "static" and not endpoint:
        endpoint = f"{args.master_addr}:{args.master_port}" if args.master_port is not None else ""
    logs_specs_cls = _logs_specs_class(args.logs_specs)
    redirects: Any = parse_std(args.redirects, "redirects")
    tee: Any = parse_std(args.tee, "tee")
    if logs_specs_cls is not LogsSpecs:  # a torchrun plugin: torch's LogsSpecs, torch's Std
        from torch.distributed.elastic.multiprocessing import Std as TorchStd

        redirects, tee = TorchStd.from_str(args.redirects), TorchStd.from_str(args.tee)
    logs_specs = logs_specs_cls(
        log_dir=args.log_dir, redirects=redirects, tee=tee,
        local_ranks_filter=_local_ranks_filter(args.local_ranks_filter),
    )
    config = LaunchConfig(
        min_nodes=min_nodes, max_nodes=max_nodes, nproc_per_node=nproc, run_id=args.rdzv_id,
        role=args.role, rdzv_endpoint=endpoint, rdzv_backend=args.rdzv_backend,
        rdzv_configs=rdzv_configs, max_restarts=args.max_restarts,
        monitor_interval=args.monitor_interval, start_method=args.start_method,
        log_line_prefix_template=os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"),
        local_addr=args.local_addr, logs_specs=logs_specs,
        event_log_handler=args.event_log_handler, signals_to_handle=args.signals_to_handle,
        virtual_local_rank=args.virtual_local_rank, shutdown_timeout=args.shutdown_timeout,
        exit_barrier_timeout=args.exit_barrier_timeout,
    )
    cmd: Callable[..., Any] | str
    cmd_args: list[str] = []
    if args.run_path:
        cmd = run_script_path
        cmd_args.append(args.training_script)
    elif args.no_python:
        cmd = args.training_script
    else:
        cmd = os.environ.get("PYTHON_EXEC", sys.executable)
        cmd_args.append("-u")
        if args.module:
            cmd_args.append("-m")
        cmd_args.append(args.training_script)
    cmd_args.extend(args.training_script_args)
    return config, cmd, cmd_args


# -- signals ----------------------------------------------------------------------------


_UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)


def _parse_signals(text: str) -> list[signal.Signals]:
    result = []
    for name in filter(None, (n.strip() for n in text.split(","))):
        try:
            result.append(signal.Signals[name])
        except KeyError:
            raise ConfigError("signals_to_handle", text, f"names an unknown signal {name!r}",
                              "--signals-to-handle") from None
        if result[-1] in _UNCATCHABLE:  # signal.signal() would raise OSError(EINVAL)
            raise ConfigError("signals_to_handle", text, f"names {name}, which no process can "
                              "catch", "--signals-to-handle")
    return result


def _install_handlers(signals: list[signal.Signals]) -> dict[signal.Signals, Any]:
    """Turn termination signals into ``SignalException`` in the main thread; returns the old ones."""

    def handler(signum: int, frame: Any) -> None:
        raise SignalException(f"process {os.getpid()} got signal {signum}", signal.Signals(signum))

    previous = {}
    for sig in signals:
        previous[sig] = signal.signal(sig, handler)
    return previous


def _restore_handlers(previous: dict[signal.Signals, Any]) -> None:
    for sig, old in previous.items():
        signal.signal(sig, old)


# -- main -------------------------------------------------------------------------------


def run_with_signal_handlers(config: Any, cmd: Any, cmd_args: list[Any], prog: str) -> Any:
    """Run the agent with termination signals turned into a clean stop; the RunResult, or
    None after printing one line saying why there is none."""
    from harness.launch import run_agent
    from harness.procs._stackdump import install_from_env

    install_from_env(os.environ)  # SIGUSR1 -> the agent's Python stacks, when its owner asks for them
    previous: dict[signal.Signals, Any] = {}
    try:
        previous = _install_handlers(_parse_signals(config.signals_to_handle))
        return run_agent(config, cmd, cmd_args)
    except SignalException as e:
        print(f"{prog}: stopped by {e.sigval.name}; workers were stopped", file=sys.stderr)
    except ElasticError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
    finally:
        _restore_handlers(previous)
    return None


def configure_logging() -> None:
    level = os.environ.get("LOGLEVEL", "WARNING").upper()
    logging.basicConfig(level=getattr(logging, level, logging.WARNING),
                        format="[elastic-run] %(levelname)s %(message)s")


def _copy_root_cause(error: ChildFailedError) -> None:
    """Nested launches: hand the root cause up through our own error file (as torch's @record)."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    from harness.errors import NOT_AVAILABLE, _copy_child_error

    _, first = error.get_first_failure()
    if first.error_file != NOT_AVAILABLE:
        try:
            _copy_child_error(path, first)
        except OSError:
            pass


class NnodesFormatError(ConfigError, RuntimeError):
    """``--nnodes`` with more than MIN:MAX; a RuntimeError too, as torch raises there."""


def main(argv: Sequence[str] | None = None) -> None:
    """``torch.distributed.run.main`` for Python callers: bad input raises (ConfigError, a
    ValueError; NnodesFormatError, a RuntimeError, where torch raises one), a failed
    worker group raises ``ChildFailedError``, a termination signal ``SignalException``."""
    configure_logging()
    args = parse_args(argv)
    config, cmd, cmd_args = config_from_args(args)
    from harness.launch import _entrypoint_name, run_agent

    previous = _install_handlers(_parse_signals(config.signals_to_handle))
    try:
        result = run_agent(config, cmd, cmd_args)
    finally:
        _restore_handlers(previous)
    if result.is_failed():
        error = ChildFailedError(_entrypoint_name(cmd, cmd_args), result.failures)
        _copy_root_cause(error)
        raise error


def cli(argv: Sequence[str] | None = None) -> int:
    """The ``elastic-run`` console script: ``main`` with every error as one line on stderr
    and torchrun's exit codes (0 success, 1 otherwise) instead of a traceback."""
    from harness.procs._stackdump import install_from_env

    install_from_env(os.environ)  # SIGUSR1 -> the agent's Python stacks, when its owner asks for them
    try:
        main(argv)
    except ChildFailedError as e:
        print(f"ChildFailedError: {e}", file=sys.stderr)
        return 1
    except SignalException as e:
        print(f"elastic-run: stopped by {e.sigval.name}; workers were stopped", file=sys.stderr)
        return 1
    except ElasticError as e:
        print(f"elastic-run: error: {e}", file=sys.stderr)
        return 1
    return 0


def _cli() -> None:
    sys.exit(cli())


if __name__ == "__main__":
    _cli()
