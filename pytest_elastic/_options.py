"""The plugin's settings, one row each: its command-line option, its ``PYTEST_ELASTIC_*``
environment variable, its ini key where it has one, its type, its default and what it does.

One table, read by three: ``pytest_addoption`` registers the options and ini keys from it,
``resolve_settings`` reads each value by its row (CLI, then environment, then ini, then the
default: a marker's keyword wins over all of them), and ``docs/reference/options.md`` is
generated from it (``pytest_elastic._reference``), so the help, the code and the reference
cannot say different things.

Standard library only: the plugin imports this at its own import time. The help texts that
list the fault kinds or start methods read ``harness.sim.schema`` when they are asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ENV_PREFIX", "OPTIONS", "Option", "option", "PRECEDENCE"]

ENV_PREFIX = "PYTEST_ELASTIC_"
#: how a setting is decided, first that is set wins
PRECEDENCE = ("the marker's or scenario's own keyword", "the command-line option", "the environment variable",
              "the ini key", "the default")


@dataclass(frozen=True)
class Option:
    """One setting (module doc). ``kind``: ``flag`` (on when given; the environment and ini
    take true/false), ``int``, ``float`` or ``text``."""

    name: str
    help: str
    kind: str = "text"
    metavar: str | None = None
    default: str = "none"  # as the reference and the help say it
    ini: bool = False

    @property
    def flag(self) -> str:
        return "--elastic-" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        """pytest's attribute for it on ``config.option``."""
        return "elastic_" + self.name

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def ini_key(self) -> str | None:
        return "elastic_" + self.name if self.ini else None

    def described(self) -> str:
        """The help text, its lists filled from the schema (chaos kinds, start methods)."""
        if "{" not in self.help:
            return self.help
        from harness.sim import schema

        aliases = "; ".join([*(f"{a} = {','.join(k)}" for a, k in schema.CHAOS_ALIASES.items()),
                             f"{schema.EVERY_CHAOS_KIND} = every kind"])
        return self.help.format(kinds=",".join(schema.CHAOS_KINDS), aliases=aliases,
                                default_kinds=",".join(schema.DEFAULT_CHAOS_KINDS),
                                start_methods=", ".join(schema.START_METHODS))

    def addoption_kwargs(self) -> dict[str, Any]:
        """What ``parser.addoption`` takes for it (every default None: unset is not the default)."""
        kwargs: dict[str, Any] = {"default": None, "help": self.described()}
        if self.kind == "flag":
            kwargs["action"] = "store_true"
        else:
            kwargs["metavar"] = self.metavar
            if self.kind in ("int", "float"):
                kwargs["type"] = int if self.kind == "int" else float
        return kwargs


OPTIONS: tuple[Option, ...] = (
    Option("chaos", "inject a seeded random fault schedule into every elastic job", "flag", default="off", ini=True),
    Option("seed", "chaos seed (replay a run); default: random, shown in the header", "int", "N",
           default="random, shown in the header"),
    Option("faults", "chaos fault kinds: {kinds} ({aliases}); default: {default_kinds}", "text", "KINDS",
           default="kill_worker", ini=True),
    Option("chaos_overload", "let chaos inject more worker failures than max_restarts allows", "flag",
           default="off"),
    Option("report", "write a drawn HTML timeline per elastic test, index.html and summary.json into DIR",
           "text", "DIR", ini=True),
    Option("start_method", "default worker start method ({start_methods})", "text", "METHOD", default="zygote",
           ini=True),
    Option("timeout", "default timeout of an elastic test (given to pytest-timeout when installed)", "float",
           "SECONDS", default="120", ini=True),
    Option("shrink_budget", "re-runs a failing chaos test may spend shrinking its fault schedule (default 8; 0: off)",
           "int", "N", default="8", ini=True),
    Option("schedule", "replay this exact fault schedule (one JSON list per job, as printed under a shrunk "
                       "failure); implies --elastic-chaos", "text", "JSON"),
    Option("project", "project the session's measured cost per fault and per checkpoint to N nodes: the "
                      "effective training time ratio and the checkpoint interval that maximises it (Young/Daly); "
                      "mtbf: node MTBF in hours or llama3 / meta-rsc (default llama3)", "text",
           "nodes=N[,mtbf=H|NAME][,interval=S][,checkpoint=S]"),
    Option("hosts", "run every elastic job's nodes on the hosts of this TOML hosts file, over SSH ([defaults] and "
                    "one [[host]] per host: address, user, port, key, python, work_dir, capabilities; "
                    "docs/hosts.md); a marker's or scenario's own hosts= wins; scenarios with faults the hosts "
                    "cannot carry out are skipped, and chaos draws only kinds they can", "text", "FILE"),
    Option("slurm", "run every elastic job's nodes in a Slurm allocation, each node's agent a job step: the "
                    "[slurm] table of this TOML file (controller_address, partition, account, time_limit, nodes, "
                    "job_id, python, capabilities, shared_dir; docs/slurm.md); inside an allocation "
                    "($SLURM_JOB_ID) it uses that one, else it makes its own and releases it; a marker's or "
                    "scenario's own hosts= or slurm= wins", "text", "FILE"),
    Option("github", "GitHub Actions output: an ::error annotation per failing elastic test and a summary table "
                     "in $GITHUB_STEP_SUMMARY (PYTEST_ELASTIC_GITHUB=false turns it off)", "flag",
           default="on where GITHUB_ACTIONS=true"),
)

_BY_NAME = {row.name: row for row in OPTIONS}


def option(name: str) -> Option:
    """The row of setting ``name``."""
    return _BY_NAME[name]
