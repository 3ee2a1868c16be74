"""Settings, resolved once per session: marker > CLI > ``PYTEST_ELASTIC_*`` env > ini.

Only the standard library here: the plugin must load without torch or the harness.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from typing import Any

__all__ = ["Settings", "MARKER_KEYWORDS", "ENV_PREFIX", "resolve_settings", "validate_marker",
           "parse_schedule", "SCHEDULE_FAULT_KINDS", "SCHEDULE_KEYS"]

ENV_PREFIX = "PYTEST_ELASTIC_"

#: keywords of ``@pytest.mark.elastic`` (those of ``harness.Cluster`` plus ``timeout``)
MARKER_KEYWORDS: dict[str, Any] = {
    "nnodes": "1",  # = "1:1"; no colon: pytest splits marker lines at the first ":"
    "nproc_per_node": 1,
    "max_restarts": 3,
    "rdzv_backend": "c10d",
    "monitor_interval": 0.1,
    "start_method": "zygote",
    "timeout": 120.0,
    "env": None,
    "rdzv_conf": None,
    "shutdown_timeout": 5.0,
    "store_host": "harness",
    "exit_barrier_timeout": 30.0,
}

_START_METHODS = ("spawn", "fork", "forkserver", "zygote")


@dataclass(frozen=True)
class Settings:
    chaos: bool = False
    seed: int = 0
    seed_given: bool = False
    faults: str = "worker"
    overload: bool = False
    report_dir: str | None = None
    start_method: str = "zygote"
    timeout: float = 120.0
    #: the timeout came from --elastic-timeout / env / ini, not the default
    timeout_given: bool = False
    #: re-runs a failing chaos test may spend shrinking its fault schedule (0: off)
    shrink_budget: int = 8
    #: ``--elastic-schedule``: an explicit schedule per job (compact JSON), replayed as given
    schedule: str | None = None

    def header(self) -> str:
        parts = [f"chaos={'on' if self.chaos else 'off'}"]
        if self.chaos:
            parts += [f"seed={self.seed}", f"faults={self.faults}"]
            if self.overload:
                parts.append("overload")
            parts.append(f"shrink={self.shrink_budget}" if self.shrink_budget else "shrink=off")
            if self.schedule is not None:
                parts.append("schedule=given")
        parts += [f"start_method={self.start_method}", f"timeout={self.timeout:g}s"]
        if self.report_dir:
            parts.append(f"report={self.report_dir}")
        return "elastic: " + " ".join(parts)


class SettingError(ValueError):
    pass


def _bool(text: str, name: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise SettingError(f"{name}={text!r} must be a boolean (1/0, true/false)")


def _pick(cli: Any, env_name: str, ini: Any, default: Any, convert: Any, name: str) -> Any:
    """The first of CLI, env, ini that is set, converted; else the default."""
    if cli is not None:
        try:
            return convert(cli)
        except (TypeError, ValueError) as e:
            flag = "--elastic-" + name.replace("_", "-")
            raise SettingError(f"{flag}={cli!r} is not valid: {e}") from None
    raw = os.environ.get(ENV_PREFIX + env_name)
    if raw is not None and raw != "":
        try:
            return convert(raw)
        except (TypeError, ValueError) as e:
            raise SettingError(f"{ENV_PREFIX}{env_name}={raw!r} is not valid for {name}: {e}") from None
    if ini not in (None, "", []):
        try:
            return convert(ini)
        except (TypeError, ValueError) as e:
            raise SettingError(f"ini elastic_{name}={ini!r} is not valid: {e}") from None
    return default


def resolve_settings(option: Any, ini: Any, seed_from_controller: int | None = None) -> Settings:
    """``option``: pytest's parsed options; ``ini``: a callable name -> ini value."""
    chaos = _pick(option.elastic_chaos, "CHAOS", ini("elastic_chaos"), False,
                  lambda v: _bool(str(v), "chaos"), "chaos")
    seed_text = _pick(option.elastic_seed, "SEED", None, None, int, "seed")
    seed_given = seed_text is not None
    if seed_from_controller is not None and not seed_given:
        seed = seed_from_controller  # xdist: every worker uses the controller's seed
    else:
        seed = int(seed_text) if seed_given else random.SystemRandom().randrange(1, 2**31)
    faults = _pick(option.elastic_faults, "FAULTS", ini("elastic_faults"), "worker", _fault_kinds, "faults")
    timeout = _pick(option.elastic_timeout, "TIMEOUT", ini("elastic_timeout"), None, _positive, "timeout")
    schedule = _pick(getattr(option, "elastic_schedule", None), "SCHEDULE", None, None,
                     _schedule_text, "schedule")

    return Settings(
        chaos=bool(chaos) or schedule is not None, seed=seed, seed_given=seed_given, faults=faults,
        overload=bool(_pick(option.elastic_chaos_overload, "CHAOS_OVERLOAD", None, False,
                            lambda v: _bool(str(v), "overload"), "overload")),
        report_dir=_pick(option.elastic_report, "REPORT", ini("elastic_report"), None, str, "report"),
        start_method=_pick(option.elastic_start_method, "START_METHOD", ini("elastic_start_method"),
                           "zygote", _start_method, "start_method"),
        timeout=120.0 if timeout is None else timeout, timeout_given=timeout is not None,
        shrink_budget=_pick(getattr(option, "elastic_shrink_budget", None), "SHRINK_BUDGET",
                            ini("elastic_shrink_budget"), 8, _non_negative_int, "shrink_budget"),
        schedule=schedule,
    )


#: chaos fault kinds (harness.sim.chaos.FAULT_KINDS, repeated so the plugin loads without the
#: harness; tests/plugin/test_settings.py pins the two together); "scale" = leave + join
FAULT_KINDS = ("worker", "hang", "agent", "node", "leave", "join", "freeze", "scale")


def _fault_kinds(value: Any) -> str:
    kinds = [k.strip() for k in str(value).split(",") if k.strip()]
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if not kinds or unknown:
        raise ValueError(f"unknown fault kind(s) {unknown or kinds}; choose from {', '.join(FAULT_KINDS)}")
    return ",".join(kinds)


def _start_method(value: Any) -> str:
    if value not in _START_METHODS:
        raise ValueError(f"must be one of {', '.join(_START_METHODS)}")
    return str(value)


def _non_negative_int(value: Any) -> int:
    number = int(value)
    if number < 0:
        raise ValueError("must be >= 0 (0 turns shrinking off)")
    return number


#: ``Fault.kind`` of every fault an explicit schedule may name (harness.faults; pinned by
#: tests/plugin/test_shrink.py) and the keys of one entry: those of a scenario's [[fault]]
SCHEDULE_FAULT_KINDS = ("worker_crash", "worker_hang", "agent_kill", "node_kill", "node_leave",
                        "node_join", "node_freeze", "store_host_loss")
SCHEDULE_KEYS = ("kind", "node", "local_rank", "sig", "exit_code", "after", "at_step", "rank",
                 "on_state", "state_node")


def parse_schedule(text: str) -> list[list[dict[str, Any]]]:
    """``[[{"kind": "worker_crash", "local_rank": 1, "after": 0.3}, ...], ...]``: one list of
    faults per job, in launch order; checked (ValueError says what is wrong)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(data, list) or not all(isinstance(job, list) for job in data):
        raise ValueError("must be a JSON list with one list of faults per job, e.g. "
                         '[[{"kind": "worker_crash", "local_rank": 1, "after": 0.3}]]')
    for j, job in enumerate(data):
        for i, entry in enumerate(job):
            where = f"job {j} fault {i}"
            if not isinstance(entry, dict):
                raise ValueError(f"{where} must be an object")
            if entry.get("kind") not in SCHEDULE_FAULT_KINDS:
                raise ValueError(f"{where} has kind={entry.get('kind')!r}; choose from "
                                 f"{', '.join(SCHEDULE_FAULT_KINDS)}")
            unknown = sorted(set(entry) - set(SCHEDULE_KEYS))
            if unknown:
                raise ValueError(f"{where} has unknown key(s) {unknown}; known: {', '.join(SCHEDULE_KEYS)}")
    return data


def _schedule_text(value: Any) -> str:
    parse_schedule(str(value))
    return str(value)


def _positive(value: Any) -> float:
    number = float(value)
    if number <= 0:
        raise ValueError("must be > 0")
    return number


def validate_marker(test_id: str, kwargs: dict[str, Any], args: tuple) -> dict[str, Any]:
    """The marker's keywords, checked; raises SettingError naming the test and keyword."""
    if args:
        raise SettingError(f"{test_id}: @pytest.mark.elastic takes keywords only, got {args!r}")
    unknown = sorted(set(kwargs) - set(MARKER_KEYWORDS))
    if unknown:
        raise SettingError(f"{test_id}: @pytest.mark.elastic got unknown keyword(s) {unknown}; "
                           f"known: {', '.join(MARKER_KEYWORDS)}")
    checks = {
        "nproc_per_node": lambda v: isinstance(v, int) and v >= 1,
        "max_restarts": lambda v: isinstance(v, int) and v >= 0,
        "monitor_interval": lambda v: isinstance(v, (int, float)) and v > 0,
        "timeout": lambda v: isinstance(v, (int, float)) and v > 0,
        "shutdown_timeout": lambda v: isinstance(v, (int, float)) and v >= 0,
        "start_method": lambda v: v in _START_METHODS,
        "store_host": lambda v: v in ("harness", "node0"),
        "nnodes": _valid_nnodes,
    }
    for key, value in kwargs.items():
        check = checks.get(key)
        if check is not None and not check(value):
            raise SettingError(f"{test_id}: @pytest.mark.elastic({key}={value!r}) is not valid")
    return kwargs


def _valid_nnodes(value: Any) -> bool:
    parts = str(value).split(":")
    if len(parts) not in (1, 2) or not all(p.strip().isdigit() for p in parts):
        return False
    low, high = int(parts[0]), int(parts[-1])
    return 1 <= low <= high

