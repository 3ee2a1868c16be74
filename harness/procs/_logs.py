"""Where worker output goes: log-dir layout, redirects, tee and console prefixes.

Layout, as torchrun's: ``<log_dir>/<run_id>_<rand>/attempt_<n>/<local_rank>/``
holding ``stdout.log``, ``stderr.log`` and ``error.json``. Without ``log_dir`` the tree
lives in a private temp dir that is removed when the agent shuts down (torch leaks a
``torchelastic_*`` dir per run).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from string import Template

from harness.errors import ERROR_FILE_ENV, ConfigError
from harness.procs._std import Std, std_for_rank

__all__ = ["LogsSpecs", "RankLogs", "AttemptLogs", "DEFAULT_PREFIX_TEMPLATE", "TorchShapedLogsSpecs",
           "as_logs_specs", "render_prefix"]

DEFAULT_PREFIX_TEMPLATE = "[${role_name}${local_rank}]:"


def render_prefix(template: str | None, role: str, rank: int, local_rank: int) -> str:
    """``[default0]:`` by default; ``${role_name}``, ``${rank}``, ``${local_rank}`` substituted."""
    return Template(template or DEFAULT_PREFIX_TEMPLATE).safe_substitute(
        role_name=role, rank=rank, local_rank=local_rank
    )


@dataclass(frozen=True)
class RankLogs:
    """One rank's files and console choices for one attempt."""

    directory: str
    error_file: str
    stdout_file: str | None  # set when stdout is redirected (or tee'd)
    stderr_file: str | None
    tee: Std
    console: bool  # False: --local-ranks-filter hides this rank from the console
    prefix: str


@dataclass
class AttemptLogs:
    attempt_dir: str
    ranks: dict[int, RankLogs] = field(default_factory=dict)


@dataclass
class LogsSpecs:
    """Resolved once: where logs go for every attempt of one agent."""

    log_dir: str | None = None
    redirects: Std | dict[int, Std] = Std.NONE
    tee: Std | dict[int, Std] = Std.NONE
    local_ranks_filter: frozenset[int] | None = None
    _root: str | None = field(default=None, init=False, repr=False)
    _owned: bool = field(default=False, init=False, repr=False)

    def root(self, run_id: str) -> str:
        """Create (once) the run's log root; owned temp dirs are removed by ``cleanup``."""
        if self._root is None:
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)[:64]
            if self.log_dir:
                try:  # a path too long, unwritable or under a file: the user's to fix, in one line
                    os.makedirs(self.log_dir, exist_ok=True)
                    self._root = tempfile.mkdtemp(prefix=f"{safe}_", dir=self.log_dir)
                except (OSError, ValueError) as e:
                    raise ConfigError("log_dir", self.log_dir, f"cannot hold the run's logs: "
                                      f"{getattr(e, 'strerror', None) or e}", "--log-dir") from None
            else:
                self._root = tempfile.mkdtemp(prefix=f"elastic_{safe}_")
                self._owned = True
        return self._root

    def reify(self, run_id: str, attempt: int, role: str,
              ranks: dict[int, int], prefix_template: str | None) -> AttemptLogs:
        """Create this attempt's dirs; ``ranks`` maps local_rank -> global rank."""
        attempt_dir = os.path.join(self.root(run_id), f"attempt_{attempt}")
        shutil.rmtree(attempt_dir, ignore_errors=True)
        logs = AttemptLogs(attempt_dir)
        for local_rank, global_rank in ranks.items():
            directory = os.path.join(attempt_dir, str(local_rank))
            os.makedirs(directory)
            redirect = std_for_rank(self.redirects, local_rank)
            tee = std_for_rank(self.tee, local_rank)
            to_file = redirect | tee
            logs.ranks[local_rank] = RankLogs(
                directory=directory,
                error_file=os.path.join(directory, "error.json"),
                stdout_file=os.path.join(directory, "stdout.log") if to_file & Std.OUT else None,
                stderr_file=os.path.join(directory, "stderr.log") if to_file & Std.ERR else None,
                tee=tee,
                console=self.local_ranks_filter is None or local_rank in self.local_ranks_filter,
                prefix=render_prefix(prefix_template, role, global_rank, local_rank),
            )
        return logs

    def cleanup(self) -> None:
        """Remove the tree if we created it in the temp dir; a user's log_dir stays."""
        if self._owned and self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
        self._root, self._owned = None, False


class TorchShapedLogsSpecs:
    """Adapts an object with torch's ``LogsSpecs`` shape (``reify(envs)`` returning
    ``stdouts``/``stderrs``/``tee_stdouts``/``tee_stderrs``/``error_files`` by local rank,
    e.g. torch's ``DefaultLogsSpecs`` or a ``torchrun.logs_specs`` plugin) to ours.

    ``envs`` carries what torch's agent would give (run id, restart count, ranks); what
    the spec writes into it (``TORCHELASTIC_ERROR_FILE``) wins. Its directories are its
    own and stay; only a scratch dir we make for callables' return values is removed.
    """

    def __init__(self, spec: object):
        self.spec = spec
        self._scratch: str | None = None

    def __repr__(self) -> str:
        return f"TorchShapedLogsSpecs({self.spec!r})"

    def _scratch_dir(self, attempt: int, local_rank: int) -> str:
        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix="elastic_logs_")
        path = os.path.join(self._scratch, f"attempt_{attempt}", str(local_rank))
        os.makedirs(path, exist_ok=True)
        return path

    def reify(self, run_id: str, attempt: int, role: str,
              ranks: dict[int, int], prefix_template: str | None) -> AttemptLogs:
        envs = {local: {"TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": str(attempt),
                        "LOCAL_RANK": str(local), "RANK": str(rank), "ROLE_NAME": role}
                for local, rank in ranks.items()}
        dest = self.spec.reify(envs)  # type: ignore[attr-defined]

        def files(name: str) -> dict[int, str]:
            return dict(getattr(dest, name, None) or {})

        outs, errs, tee_outs, tee_errs = (files(n) for n in ("stdouts", "stderrs", "tee_stdouts",
                                                               "tee_stderrs"))
        error_files = files("error_files")
        logs = AttemptLogs(str(getattr(dest, "attempt_log_dir", "") or ""))
        for local, rank in ranks.items():
            error_file = envs[local].get(ERROR_FILE_ENV) or error_files.get(local, "")
            directory = os.path.dirname(error_file) if error_file else ""
            if not directory or not os.path.isdir(directory):
                directory = self._scratch_dir(attempt, local)
            tee = Std.NONE
            if local in tee_outs:
                tee |= Std.OUT
            if local in tee_errs:
                tee |= Std.ERR
            logs.ranks[local] = RankLogs(
                directory=directory, error_file=error_file or os.path.join(directory, "error.json"),
                stdout_file=outs.get(local) or tee_outs.get(local),
                stderr_file=errs.get(local) or tee_errs.get(local),
                tee=tee, console=True, prefix=render_prefix(prefix_template, role, rank, local),
            )
        return logs

    def cleanup(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        cleanup = getattr(self.spec, "cleanup", None)
        if callable(cleanup):
            cleanup()


def as_logs_specs(spec: object | None) -> LogsSpecs | TorchShapedLogsSpecs:
    """Ours as is; ``None`` -> the default; anything else must have torch's shape."""
    if spec is None:
        return LogsSpecs()
    if isinstance(spec, (LogsSpecs, TorchShapedLogsSpecs)):
        return spec
    if not callable(getattr(spec, "reify", None)):
        from harness.errors import ConfigError

        raise ConfigError("logs_specs", spec, "must have reify(envs) like torch's LogsSpecs")
    return TorchShapedLogsSpecs(spec)
