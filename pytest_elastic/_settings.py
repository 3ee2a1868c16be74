"""Settings, resolved once per session: marker > CLI > ``PYTEST_ELASTIC_*`` env > ini; and
the keys of what a session (``config.stash``) and a test (``item.stash``) remember.

The bottom of the plugin: every other module of ``pytest_elastic`` may import this one, and
it imports none of them but ``_options``, the settings' table (standard library only;
``tests/unit/test_layers.py`` checks the plugin has no import cycle).

The keys and their checks come from ``harness.sim.schema`` (one definition for the marker,
``Cluster``, scenarios, fault specs and chaos kinds). The plugin imports this module at its
own import time, which must load neither torch nor the engine (only the error root,
``harness.errors``), so the schema is imported
lazily: inside the functions that check values (they run in ``pytest_configure`` or later),
and for the names below on first access (module ``__getattr__``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from harness.errors import ElasticError
from pytest_elastic._options import ENV_PREFIX
from pytest_elastic._options import option as _option

if TYPE_CHECKING:
    from harness.hosts import HostSpec
    from harness.sim.config import ClusterConfig
    from harness.sim.faults.chaos import ChaosConfig
    from pytest_elastic._places import SessionPlace

# (+ MARKER_KEYWORDS, FAULT_KINDS, SCHEDULE_FAULT_KINDS, SCHEDULE_KEYS: lazy, see _FROM_SCHEMA)
__all__ = ["Settings", "ENV_PREFIX", "resolve_settings", "marker_config", "parse_schedule", "chaos_kinds_on_hosts",
           "hosts_line", "ElasticRecord", "settings_of", "SETTINGS_KEY", "STATS_KEY", "STACKS_CLEANUP_KEY", "POOL_KEY",
           "RECORD_KEY", "TIMEOUT_STACKS_KEY", "SCHEDULE_OVERRIDE_KEY"]


#: names derived from ``harness.sim.schema``, loaded on first access (see the docstring)
_FROM_SCHEMA: dict[str, Callable[[Any], Any]] = {
    "MARKER_KEYWORDS": lambda s: {key.name: key.default for key in s.MARKER_OPTIONS},
    "FAULT_KINDS": lambda s: s.CHAOS_CHOICES,  # chaos kinds, aliases ("scale") included
    "SCHEDULE_FAULT_KINDS": lambda s: tuple(s.FAULT_KINDS),
    "SCHEDULE_KEYS": lambda s: tuple(sorted(s.SPEC_KEYS)),
}


def __getattr__(name: str) -> Any:
    derive = _FROM_SCHEMA.get(name)
    if derive is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from harness.sim import schema

    return derive(schema)


@dataclass(frozen=True)
class Settings:
    chaos: bool = False
    seed: int = 0
    seed_given: bool = False
    faults: str = "kill_worker"
    overload: bool = False
    report_dir: str | None = None
    start_method: str = "zygote"
    timeout: float = 120.0
    #: the timeout came from --elastic-timeout / env / ini, not the default
    timeout_given: bool = False
    #: re-runs a failing chaos test may spend shrinking its fault schedule (0: off)
    shrink_budget: int = 8
    #: ``--elastic-project``: project the session's measured fault and checkpoint costs to a
    #: cluster of this shape (``nodes=N[,mtbf=H|NAME][,interval=S][,checkpoint=S]``), validated
    project: str | None = None
    #: ``--elastic-schedule``: an explicit schedule per job (compact JSON), replayed as given
    schedule: str | None = None
    #: the chaos kinds were named (--elastic-faults, env, ini), not the default
    faults_given: bool = False
    #: ``--elastic-hosts`` or ``--elastic-slurm``: where every cluster the plugin builds runs
    #: its nodes, unless the marker or scenario names its own place (``hosts`` or ``slurm``)
    place: SessionPlace | None = None

    def placed_by_option(self) -> tuple[HostSpec, ...] | None:
        """The hosts the session's option puts every job's nodes on (a Slurm allocation's
        stand-ins: ``harness.hosts.stand_ins``), what faults and chaos kinds are judged by;
        None: this machine."""
        return self.place.stand_ins(2) if self.place is not None else None

    def place_option(self) -> str:
        """The option that placed the nodes, as the user wrote it (for a skip's reason)."""
        return self.place.option if self.place is not None else ""

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
        if self.place is not None:
            parts.append(self.place.header_part())
        return "elastic: " + " ".join(parts)


class SettingError(ElasticError, ValueError):
    """A plugin setting (CLI, env, ini or marker) is not valid; the message names it.

    Under the one root every error this project raises on purpose derives from, so a
    user's ``except ElasticError`` catches a bad setting too. ``harness.errors`` is light
    (no agent, no simulation, no torch): importing it here keeps the plugin's import cheap.
    """


def _bool(text: str, name: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise SettingError(f"{name}={text!r} must be a boolean (1/0, true/false)")


def _pick(name: str, option: Any, ini: Any, default: Any, convert: Any) -> Any:
    """Setting ``name``'s value: the first of its CLI option, its environment variable and
    its ini key (``pytest_elastic._options``) that is set, converted; else ``default``."""
    row = _option(name)
    cli = getattr(option, row.dest, None)
    if cli is not None:
        try:
            return convert(cli)
        except (TypeError, ValueError) as e:
            raise SettingError(f"{row.flag}={cli!r} is not valid: {e}") from None
    raw = os.environ.get(row.env)
    if raw is not None and raw != "":
        try:
            return convert(raw)
        except (TypeError, ValueError) as e:
            raise SettingError(f"{row.env}={raw!r} is not valid for {name}: {e}") from None
    given = ini(row.ini_key) if row.ini_key is not None else None
    if given not in (None, "", []):
        try:
            return convert(given)
        except (TypeError, ValueError) as e:
            raise SettingError(f"ini {row.ini_key}={given!r} is not valid: {e}") from None
    return default


def resolve_settings(option: Any, ini: Any, seed_from_controller: int | None = None, processes: int = 1) -> Settings:
    """``option``: pytest's parsed options; ``ini``: a callable name -> ini value;
    ``processes``: how many processes run the session's tests at once (pytest -n): with
    more than one, two jobs may run on one host of ``--elastic-hosts`` at once, so the
    hosts are not a job's alone (``exclusive`` false: a fault on a whole host is refused)."""
    chaos = _pick("chaos", option, ini, False, lambda v: _bool(str(v), "chaos"))
    seed_text = _pick("seed", option, ini, None, int)
    seed_given = seed_text is not None
    if seed_from_controller is not None and not seed_given:
        seed = seed_from_controller  # xdist: every worker uses the controller's seed
    else:
        seed = int(seed_text) if seed_given else random.SystemRandom().randrange(1, 2**31)
    faults = _pick("faults", option, ini, None, _fault_kinds)
    timeout = _pick("timeout", option, ini, None, _positive)
    schedule = _pick("schedule", option, ini, None, _schedule_text)
    hosts_file, hosts = _pick("hosts", option, ini, (None, None), _hosts_file)
    if hosts is not None and processes > 1:
        hosts = tuple(dataclasses.replace(host, exclusive=False) for host in hosts)
    slurm_file, slurm = _pick("slurm", option, ini, (None, None), _slurm_file)
    if slurm is not None and hosts is not None:
        raise SettingError(f"--elastic-slurm={slurm_file!r} and --elastic-hosts={hosts_file!r} are two places "
                           "for the same nodes: give one")
    from pytest_elastic._places import hosts_option, slurm_option

    place = (hosts_option(str(hosts_file), hosts) if hosts is not None else
             slurm_option(str(slurm_file), slurm) if slurm is not None else None)

    settings = Settings(
        chaos=bool(chaos) or schedule is not None, seed=seed, seed_given=seed_given,
        faults="kill_worker" if faults is None else faults, faults_given=faults is not None,
        place=place,
        overload=bool(_pick("chaos_overload", option, ini, False, lambda v: _bool(str(v), "overload"))),
        report_dir=_pick("report", option, ini, None, str),
        start_method=_pick("start_method", option, ini, "zygote", _start_method),
        timeout=120.0 if timeout is None else timeout, timeout_given=timeout is not None,
        shrink_budget=_pick("shrink_budget", option, ini, 8, _non_negative_int),
        schedule=schedule,
        project=_pick("project", option, ini, None, _project_text),
    )
    placed = settings.placed_by_option()
    if settings.chaos and placed is not None and settings.schedule is None:
        kinds, dropped = chaos_kinds_on_hosts(settings, placed)
        if not kinds:
            assert place is not None
            raise SettingError(f"--elastic-faults={settings.faults!r} names no kind the hosts of "
                               f"{place.option}={place.file!r} can carry out: {_dropped(dropped)}; "
                               f"name others, or leave --elastic-faults out (chaos on hosts then draws "
                               f"what they can do)")
    return settings


def _hosts_file(value: Any) -> tuple[str, tuple[HostSpec, ...]]:
    """``--elastic-hosts``: the file as given, and its hosts (``harness.hosts.load_hosts``:
    one ``ConfigError`` line naming the file, the host and the field)."""
    from harness.hosts import load_hosts

    return str(value), tuple(load_hosts(str(value)))


def _slurm_file(value: Any) -> tuple[str, Any]:
    """``--elastic-slurm``: the file as given, and its spec (``harness.hosts.load_slurm``: one
    ``ConfigError`` line naming the file and the field)."""
    from harness.hosts import load_slurm

    return str(value), load_slurm(str(value))


def chaos_kinds_on_hosts(settings: Settings, hosts: tuple[HostSpec, ...]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The chaos kinds to draw where the nodes are on ``hosts``, and each kind asked for
    that is left out, with why (``harness.sim.places.hosts.refusals.host_refusal``: a kind is drawn
    only if every host can carry it out, whichever node chaos picks). The kinds asked
    for are ``settings.faults``; where those are the default (no ``--elastic-faults``) and
    the hosts can carry out none of them, every chaos kind they can (today the process
    faults: the default, kill_worker, is one of them)."""
    from harness.sim.places.hosts.refusals import host_refusal, shared_host_refusal
    from harness.sim.places.hosts.shared import shared_fs_refusal
    from harness.sim.schema import CHAOS_KINDS, parse_chaos_kinds

    def why_not(kind: str) -> str | None:
        why = next((why for host in hosts if (why := host_refusal(host, kind, CHAOS_KINDS[kind].needs))), None)
        if why is None and CHAOS_KINDS[kind].part == "network":  # a host other jobs run on too (pytest -n)
            why = next((why for host in hosts if (why := shared_host_refusal(host, kind))), None)
        if why is None and CHAOS_KINDS[kind].part == "storage":  # it may draw the shared fs: any node's
            shared = shared_fs_refusal(hosts, hosts)
            why = f"chaos on hosts draws no {kind}: it may draw the shared filesystem, and {shared}" if shared else None
        return why

    asked = parse_chaos_kinds(settings.faults)
    dropped = {kind: why for kind in asked if (why := why_not(kind)) is not None}
    kinds = tuple(kind for kind in asked if kind not in dropped)
    if not kinds and not settings.faults_given:
        kinds = tuple(kind for kind in CHAOS_KINDS if why_not(kind) is None)
    return kinds, dropped


def _dropped(dropped: dict[str, str]) -> str:
    """``kill_worker, hang_worker (host ... cannot do it: ...)``: the kinds, by reason."""
    by_reason: dict[str, list[str]] = {}
    for kind, why in dropped.items():
        by_reason.setdefault(why, []).append(kind)
    return "; ".join(f"{', '.join(kinds)} ({why})" for why, kinds in by_reason.items())


def hosts_line(settings: Settings) -> str | None:
    """The report header's line about ``--elastic-hosts`` or ``--elastic-slurm`` (None
    without either): the hosts or the allocation, and under chaos the kinds drawn there and
    those left out, with why."""
    placed = settings.placed_by_option()
    if placed is None or settings.place is None:
        return None
    line = f"elastic: {settings.place.described()}"
    if settings.chaos and settings.schedule is None:
        from harness.sim.places.hosts.refusals import NETWORK_CHAOS_ON_HOSTS
        from harness.sim.schema import CHAOS_KINDS

        kinds, dropped = chaos_kinds_on_hosts(settings, placed)
        line += f"; chaos draws {','.join(kinds)} there"
        if any(CHAOS_KINDS[kind].part == "network" for kind in kinds):
            line += f" ({NETWORK_CHAOS_ON_HOSTS})"
        if dropped:
            line += f", not {_dropped(dropped)}"
    return line


#: ``--elastic-project`` keys -> ``project_goodput`` arguments
PROJECT_KEYS = {"nodes": "nodes", "mtbf": "mtbf_node_hours", "interval": "checkpoint_interval_s",
                "checkpoint": "checkpoint_cost_s"}


def parse_project(text: str) -> dict[str, Any]:
    """``nodes=1024,mtbf=llama3,interval=600`` -> ``project_goodput`` keyword arguments."""
    out: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if not sep or key not in PROJECT_KEYS:
            raise ValueError(f"{part!r} is not KEY=VALUE with KEY one of {', '.join(PROJECT_KEYS)}")
        if key == "nodes":
            out["nodes"] = int(value)
            if out["nodes"] < 1:
                raise ValueError("nodes must be >= 1")
        elif key == "mtbf":
            try:
                out[PROJECT_KEYS[key]] = float(value)
            except ValueError:
                out[PROJECT_KEYS[key]] = value  # a name of a published rate; project_goodput checks it
        else:
            out[PROJECT_KEYS[key]] = float(value)
    if "nodes" not in out:
        raise ValueError("needs nodes=N (e.g. nodes=1024)")
    return out


def _project_text(value: Any) -> str:
    parse_project(str(value))
    return str(value)


def _fault_kinds(value: Any) -> str:
    from harness.errors import ConfigError
    from harness.sim.schema import parse_chaos_kinds

    names = [k.strip() for k in str(value).split(",") if k.strip()]
    if not names:
        raise ValueError("names no fault kind")
    try:
        parse_chaos_kinds(",".join(names))  # an old name warns here, once per session
    except ConfigError as e:
        raise ValueError(e.constraint) from None
    from harness.sim.schema import RENAMED_CHAOS_KINDS

    return ",".join(RENAMED_CHAOS_KINDS.get(name, name) for name in names)


def _start_method(value: Any) -> str:
    from harness.sim.schema import START_METHODS

    if value not in START_METHODS:
        raise ValueError(f"must be one of {', '.join(START_METHODS)}")
    return str(value)


def _non_negative_int(value: Any) -> int:
    number = int(value)
    if number < 0:
        raise ValueError("must be >= 0 (0 turns shrinking off)")
    return number


def parse_schedule(text: str) -> list[list[dict[str, Any]]]:
    """``[[{"kind": "kill_worker", "local_rank": 1, "after_healthy": 0.3}, ...], ...]``: one list of
    faults per job, in launch order, each a fault spec (``harness.sim.schema``, the keys of
    a scenario's ``[[fault]]``); checked (ValueError names the job, fault and key)."""
    from harness.errors import ConfigError
    from harness.sim.schema import check_fault_spec

    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:  # [[[[...]]]] past the decoder's depth
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(data, list) or not all(isinstance(job, list) for job in data):
        raise ValueError("must be a JSON list with one list of faults per job, e.g. "
                         '[[{"kind": "kill_worker", "local_rank": 1, "after_healthy": 0.3}]]')
    for j, job in enumerate(data):
        for i, entry in enumerate(job):
            if not isinstance(entry, dict):
                raise ValueError(f"job {j} fault {i} must be an object")
            try:
                check_fault_spec(entry)
            except ConfigError as e:
                raise ValueError(f"job {j} fault {i}: {e}") from None
    return data


def _schedule_text(value: Any) -> str:
    parse_schedule(str(value))
    return str(value)


def _positive(value: Any) -> float:
    number = float(value)
    if number <= 0:
        raise ValueError("must be > 0")
    return number


def marker_config(test_id: str, kwargs: dict[str, Any], args: tuple[Any, ...],
                  defaults: dict[str, Any] | None = None, chaos: ChaosConfig | None = None) -> ClusterConfig:
    """The ``harness.ClusterConfig`` of a test's marker: its keywords but ``timeout`` over
    ``defaults`` (the session's start method), with the plugin's ``chaos``; each value checked
    once, by the config (the schema's keys). Raises SettingError naming the test, the keyword
    and what it must be."""
    from harness import ClusterConfig  # the facade, as the plugin takes Cluster and WarmPool
    from harness.errors import ConfigError
    from harness.sim.schema import MARKER_OPTIONS, TIMEOUT

    if args:
        raise SettingError(f"{test_id}: @pytest.mark.elastic takes keywords only, got {args!r}")
    known = [key.name for key in MARKER_OPTIONS]
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise SettingError(f"{test_id}: @pytest.mark.elastic got unknown keyword(s) {unknown}; "
                           f"known: {', '.join(known)}")
    settings = {**(defaults or {}), **{k: v for k, v in kwargs.items() if k != TIMEOUT.name}}
    try:
        if TIMEOUT.name in kwargs:
            TIMEOUT.validate(kwargs[TIMEOUT.name])  # the test's, not the cluster's
        return ClusterConfig(**settings, chaos=chaos)
    except ConfigError as e:
        raise SettingError(f"{test_id}: @pytest.mark.elastic({e.name}={e.value!r}) is not valid: "
                           f"{e.constraint}") from None


# -- what a session and a test remember ------------------------------------------------------
#
# State lives in pytest's stashes, never in module globals: an in-process pytester run (a
# session inside a session) and every xdist worker get their own, and it ends with its owner.


@dataclass
class ElasticRecord:
    """What the plugin remembers about one test's elastic run (``item.stash[RECORD_KEY]``)."""

    cluster: Any  # harness.Cluster (not imported here: the plugin's import stays light)
    settings: Settings
    chaos_seed: int | None = None
    call_failed: bool = False
    problems: list[str] = field(default_factory=list)
    #: phase -> ids of the chaos entries still pending (not fired) when its report was made
    pending_ids: dict[str, set[int]] = field(default_factory=dict)
    #: job index -> its failed ranks, read while the job's files exist (``report.failures``)
    failures: dict[int, list[Any]] = field(default_factory=dict)
    #: job index -> its agents that failed with no failed worker, with their logs' ends, read
    #: with ``failures`` (``report.failures.agents_failed_alone``)
    alone: dict[int, str] = field(default_factory=dict)


#: config: the settings of this session (``pytest_configure``)
SETTINGS_KEY = pytest.StashKey[Settings]()
#: config: the ``elastic_*`` properties of every elastic test's teardown report, for the summary
STATS_KEY = pytest.StashKey[list[dict[str, Any]]]()
#: config: removes this session's stack-dump dir (pytest-timeout's thread method calls it before os._exit)
STACKS_CLEANUP_KEY = pytest.StashKey[Callable[[], None]]()
#: config: this session's ``harness.WarmPool`` (the first elastic test starts it; unconfigure closes it)
POOL_KEY = pytest.StashKey[Any]()
#: item: its elastic run (the fixture's or the scenario's cluster, and what its reports found)
RECORD_KEY = pytest.StashKey[ElasticRecord]()
#: item: its workers' stacks, taken when pytest-timeout fired (signal method), for its report
TIMEOUT_STACKS_KEY = pytest.StashKey[str]()
#: item: explicit per-job chaos schedules for its next run (shrinking sets them around a re-run)
SCHEDULE_OVERRIDE_KEY = pytest.StashKey[tuple[Any, ...]]()


def settings_of(config: pytest.Config) -> Settings:
    return config.stash[SETTINGS_KEY]

