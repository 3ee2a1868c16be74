"""Differential tests: one worker script under torch's ``torchrun`` (the oracle) and ours.

Each test starts ``python -m torch.distributed.run ARGS`` (what the ``torchrun`` console
script runs) and ``python -m harness.run ARGS`` side by side, with the same arguments and
environment, and compares per rank what the workers saw and what the launcher did.
The worker is ``tests/scripts/diff_probe.py``: every worker writes its whole ``os.environ``,
argv, cwd and interpreter to ``$DIFF_PROBE_DIR/attempt<N>_rank<R>.json``, so the comparison
does not depend on console interleaving, and it fails or all-reduces on request.

Compared exactly: every worker environment variable, argv, cwd, interpreter; the set of
(attempt, rank) pairs that ran; the launcher's exit code; the worker lines on the console;
the root-cause block of the failure report; the per-rank files under ``--log-dir``.

Normalised, because they legitimately differ between two runs:
  MASTER_PORT              any free port; checked to be one port per attempt within a run
  TORCHELASTIC_RUN_ID      ``--standalone`` draws a fresh uuid4; checked to be one per run
  TORCHELASTIC_ERROR_FILE  the run dir differs (``torchelastic_*/<run_id>_*`` vs
                           ``elastic_<run_id>_*``); the suffix ``attempt_N/<local_rank>/
                           error.json`` is compared, and the run dir must be under TMPDIR
                           or ``--log-dir``
  DIFF_PROBE_DIR           the probe's own output dir, one per launcher
  error.json "timestamp"   seconds since the epoch when the error was recorded

Restart mode: torchrun runs with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``. With torch's
default (workers reuse the agent's TCPStore across attempts) restarts fail 23 of 31 times
(stale keys, pytorch#135712). With it set,
torch gives workers ``TORCHELASTIC_USE_AGENT_STORE=False`` (worker rank 0 hosts the store).
The variable is set for both launchers (ours honours it the same way; without it ours hosts
a fresh store per attempt in the agent, see ``tests/runtime/test_agent_store.py``), so that
variable is compared exactly.

Both launchers share one TMPDIR under the test's ``tmp_path``: torchrun leaves a
``torchelastic_*`` tree there after every run (that stays inside ``tmp_path``); ours must
leave nothing, which each test checks.

Known, deliberate divergences, asserted as such rather than hidden:
  * torchrun's report lists the peers it SIGTERMed after the root cause as "other failures"
    (exitcode -15); ours lists only workers that failed on their own. Each failure ours
    lists must be one torchrun lists too, and every extra one of torchrun's a SIGTERM.
  * torchrun puts ``TORCHELASTIC_SIGNALS_TO_HANDLE`` into its own ``os.environ``, so its
    workers inherit it; ``test_signals_to_handle_reaches_workers`` pins that on its own
    and the other comparisons leave that one variable out.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS

pytestmark = pytest.mark.torchrun

PROBE = SCRIPTS / "diff_probe.py"
LAUNCHERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
    "ours": [sys.executable, "-m", "harness.run"],
}
RUN_TIMEOUT_S = 90
# Replaced by "<volatile>" before comparing (see the module docstring); TORCHELASTIC_ERROR_FILE
# is cut to its attempt_N/<local_rank>/error.json suffix instead.
VOLATILE = ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "DIFF_PROBE_DIR")
SIGNALS_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"


@dataclass
class Outcome:
    """What one launcher did: exit code, console, and the probe records of every worker."""

    name: str
    returncode: int
    stdout: str
    stderr: str
    tmpdir: Path
    log_dir: Path | None
    records: dict[tuple[int, int], dict] = field(default_factory=dict)  # (attempt, rank)
    sums: dict[tuple[int, int], dict] = field(default_factory=dict)

    def attempts(self) -> dict[int, list[int]]:
        """{attempt: [ranks that started in it]}."""
        ran: dict[int, list[int]] = {}
        for attempt, rank in sorted(self.records):
            ran.setdefault(attempt, []).append(rank)
        return ran

    def describe(self) -> str:
        return (f"--- {self.name}: rc={self.returncode}\n--- stdout:\n{self.stdout[-3000:]}"
                f"\n--- stderr:\n{self.stderr[-3000:]}")


def _read_records(probe_dir: Path, prefix: str) -> dict[tuple[int, int], dict]:
    records = {}
    for path in probe_dir.glob(f"{prefix}*_rank*.json"):
        match = re.fullmatch(rf"{prefix}(\d+)_rank(\d+)\.json", path.name)
        if match:
            records[(int(match[1]), int(match[2]))] = json.loads(path.read_text())
    return records


def run_both(tmp_path: Path, launcher_args: list[str], script: list[str], *,
             log_dir: bool = False, cwd: Path | None = None) -> tuple[Outcome, Outcome]:
    """Run torchrun and ours at the same time on ``launcher_args + script``.

    Returns (torchrun, ours). Each launcher gets its own probe dir and, with ``log_dir``,
    its own ``--log-dir``; both share ``tmp_path/tmp`` as TMPDIR. The launchers run in
    their own sessions and are killed as a group if they outlive ``RUN_TIMEOUT_S``.
    """
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PET_") and k not in ("TORCHELASTIC_ERROR_FILE", SIGNALS_ENV)}
    env.update(TMPDIR=str(shared_tmp), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    procs, outcomes = {}, {}
    try:
        for name, launcher in LAUNCHERS.items():
            base = tmp_path / name
            (base / "probe").mkdir(parents=True)
            args = list(launcher_args)
            if log_dir:
                args.append(f"--log-dir={base / 'logs'}")
            out, err = open(base / "stdout", "w"), open(base / "stderr", "w")
            with out, err:
                procs[name] = subprocess.Popen(
                    [*launcher, *args, *script], stdout=out, stderr=err, cwd=cwd,
                    env={**env, "DIFF_PROBE_DIR": str(base / "probe")}, start_new_session=True)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        for name, proc in procs.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name} {launcher_args} {script} still running after "
                            f"{RUN_TIMEOUT_S}s: {(tmp_path / name / 'stderr').read_text()[-2000:]}")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for name, proc in procs.items():
        base = tmp_path / name
        outcomes[name] = Outcome(
            name=name, returncode=proc.returncode, stdout=(base / "stdout").read_text(),
            stderr=(base / "stderr").read_text(), tmpdir=shared_tmp,
            log_dir=base / "logs" if log_dir else None,
            records=_read_records(base / "probe", "attempt"),
            sums=_read_records(base / "probe", "sum_attempt"))
    leftovers = sorted(p.name for p in shared_tmp.glob("elastic_*"))
    assert not leftovers, f"ours left temp dirs in TMPDIR: {leftovers}"
    return outcomes["torchrun"], outcomes["ours"]


# -- normalising and comparing ----------------------------------------------------------


def _error_file_suffix(path: str, outcome: Outcome) -> str:
    """``.../attempt_N/<local_rank>/error.json`` -> ``attempt_N/<local_rank>/error.json``."""
    parts = Path(path).parts
    roots = [outcome.tmpdir] + ([outcome.log_dir] if outcome.log_dir else [])
    assert any(Path(path).is_relative_to(root) for root in roots), (
        f"{outcome.name}: TORCHELASTIC_ERROR_FILE={path} is outside {roots}")
    assert re.fullmatch(r"attempt_\d+", parts[-3]) and parts[-1] == "error.json", path
    return "/".join(parts[-3:])


def normalised(outcome: Outcome) -> dict[tuple[int, int], dict]:
    """Each record with the volatile values replaced by what must hold about them."""
    result = {}
    run_ids = {r["env"]["TORCHELASTIC_RUN_ID"] for r in outcome.records.values()}
    assert len(run_ids) == 1, f"{outcome.name}: several run ids {run_ids}"
    ports: dict[int, set[str]] = {}
    for (attempt, rank), record in outcome.records.items():
        env = dict(record["env"])
        env.pop(SIGNALS_ENV, None)  # test_signals_to_handle_reaches_workers
        ports.setdefault(attempt, set()).add(env["MASTER_PORT"])
        assert env["MASTER_PORT"].isdigit(), env["MASTER_PORT"]
        env["TORCHELASTIC_ERROR_FILE"] = _error_file_suffix(env["TORCHELASTIC_ERROR_FILE"], outcome)
        for key in VOLATILE:
            env[key] = "<volatile>"
        result[(attempt, rank)] = {**record, "env": env}
    assert all(len(p) == 1 for p in ports.values()), f"{outcome.name}: MASTER_PORT per attempt {ports}"
    return result


def assert_same_workers(torch_run: Outcome, ours: Outcome) -> None:
    """Same (attempt, rank) pairs, and per pair the same environment, argv, cwd, interpreter."""
    assert ours.attempts() == torch_run.attempts(), f"{torch_run.describe()}\n{ours.describe()}"
    expected, got = normalised(torch_run), normalised(ours)
    diffs = []
    for key in sorted(expected):
        want, have = expected[key], got[key]
        for field_name in ("argv", "cwd", "executable"):
            if want[field_name] != have[field_name]:
                diffs.append(f"attempt/rank {key} {field_name}: torchrun={want[field_name]!r} "
                             f"ours={have[field_name]!r}")
        for var in sorted(set(want["env"]) | set(have["env"])):
            if want["env"].get(var) != have["env"].get(var):
                diffs.append(f"attempt/rank {key} ${var}: torchrun={want['env'].get(var)!r} "
                             f"ours={have['env'].get(var)!r}")
    assert not diffs, "worker environments differ:\n" + "\n".join(diffs)


_PREFIX = r"(\[[^\]]*\]:)?"


def worker_lines(text: str) -> Counter:
    """The probe's console lines (with any ``[role N]:`` prefix), as a multiset."""
    return Counter(line for line in text.splitlines() if re.fullmatch(_PREFIX + r"PROBE .*", line))


def assert_same_console(torch_run: Outcome, ours: Outcome) -> None:
    assert worker_lines(ours.stdout) == worker_lines(torch_run.stdout)
    assert worker_lines(ours.stderr) == worker_lines(torch_run.stderr)


@dataclass(frozen=True)
class Failure:
    rank: int
    local_rank: int
    exitcode: int
    error_file: str  # "<N/A>" or the attempt_N/<local_rank>/error.json suffix
    last_line: str  # last line of the traceback field


def _parse_block(block: str) -> Failure:
    fields: dict[str, list[str]] = {}
    current = None
    for line in block.splitlines():
        match = re.match(r"  (time|host|rank|exitcode|error_file|traceback)\s*: ?(.*)$", line)
        if match:
            current = match[1]
            fields[current] = [match[2].rstrip()]
        elif current:
            fields[current].append(line.strip())
    rank, local_rank = re.fullmatch(r"(\d+) \(local_rank: (\d+)\)", fields["rank"][0]).groups()
    error_file = fields["error_file"][0]
    if error_file != "<N/A>":
        error_file = "/".join(Path(error_file).parts[-3:])
    trace = [line for line in fields["traceback"] if line]
    return Failure(int(rank), int(local_rank), int(fields["exitcode"][0].split()[0]),
                   error_file, trace[-1])


def parse_report(stderr: str) -> tuple[str, Failure, list[Failure]]:
    """The ChildFailedError report: (title, root cause, other failures)."""
    match = re.search(r"={20,}\n(?P<title>.*) FAILED\n-+\nFailures:\n(?P<others>.*?)\n-+\n"
                      r"Root Cause \(first observed failure\):\n(?P<root>.*?)\n={20,}", stderr, re.S)
    assert match, f"no failure report in:\n{stderr[-3000:]}"
    others = [] if "<NO_OTHER_FAILURES>" in match["others"] else [
        _parse_block(b) for b in re.split(r"^\[\d+\]:\n", match["others"], flags=re.M) if b.strip()]
    [root] = [_parse_block(b) for b in re.split(r"^\[\d+\]:\n", match["root"], flags=re.M) if b.strip()]
    return match["title"], root, others


def assert_same_report(torch_run: Outcome, ours: Outcome) -> Failure:
    torch_title, torch_root, torch_others = parse_report(torch_run.stderr)
    our_title, our_root, our_others = parse_report(ours.stderr)
    assert our_title == torch_title
    assert our_root == torch_root
    # torchrun also lists the peers it stopped (SIGTERM) after the root cause; ours need not
    assert set(our_others) <= set(torch_others), (our_others, torch_others)
    assert all(f.exitcode == -signal.SIGTERM for f in set(torch_others) - set(our_others)), torch_others
    return torch_root


# -- the cases --------------------------------------------------------------------------


def _no_python_wrapper(tmp_path: Path) -> Path:
    wrapper = tmp_path / "probe.sh"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{PROBE}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper


@pytest.mark.parametrize("launcher_args,form", [
    pytest.param(["--nproc-per-node=1"], "script", id="nproc1"),
    pytest.param(["--nproc-per-node=2"], "script", id="nproc2"),
    pytest.param(["--nproc-per-node=3", "--max-restarts=3"], "script", id="nproc3-max-restarts3"),
    pytest.param(["--nproc-per-node=2", "--role=trainer"], "script", id="role"),
    pytest.param(["--nproc-per-node=2"], "module", id="module"),
    pytest.param(["--nproc-per-node=2"], "no-python", id="no-python"),
])
def test_worker_environment_and_argv(tmp_path, launcher_args, form):
    args = ["x", "--y=1", "a,b"]
    cwd = None
    if form == "script":
        script = [str(PROBE), *args]
    elif form == "module":
        script, cwd = ["-m", PROBE.stem, *args], SCRIPTS
    else:
        script = [str(_no_python_wrapper(tmp_path)), *args]
        launcher_args = [*launcher_args, "--no-python"]
    torch_run, ours = run_both(tmp_path, ["--standalone", *launcher_args], script, cwd=cwd)
    assert (torch_run.returncode, ours.returncode) == (0, 0), f"{torch_run.describe()}\n{ours.describe()}"
    nproc = int(launcher_args[0].split("=")[1])
    assert torch_run.attempts() == {0: list(range(nproc))}
    assert_same_workers(torch_run, ours)
    assert_same_console(torch_run, ours)


def test_crash_once_restarts_the_same_ranks_and_gloo_works_after(tmp_path):
    torch_run, ours = run_both(tmp_path, ["--standalone", "--nproc-per-node=2", "--max-restarts=2"],
                               [str(PROBE), "--fail-rank=1", "--fail-attempts=1", "--allreduce"])
    assert (torch_run.returncode, ours.returncode) == (0, 0), f"{torch_run.describe()}\n{ours.describe()}"
    assert torch_run.attempts() == {0: [0, 1], 1: [0, 1]}
    assert_same_workers(torch_run, ours)
    assert_same_console(torch_run, ours)
    assert ours.sums == torch_run.sums == {
        (1, r): {"rank": r, "world": 2, "sum": 3.0} for r in (0, 1)}


@pytest.mark.parametrize("max_restarts,fail", [
    pytest.param(2, ["--fail-rank=1", "--fail-code=7"], id="exit7-rank1"),
    pytest.param(1, ["--fail-rank=0", "--raise"], id="torch-record-rank0"),
])
def test_always_failing_exhausts_restarts_with_the_same_root_cause(tmp_path, max_restarts, fail):
    torch_run, ours = run_both(
        tmp_path, ["--standalone", "--nproc-per-node=2", f"--max-restarts={max_restarts}"],
        [str(PROBE), *fail])
    assert (torch_run.returncode, ours.returncode) == (1, 1), f"{torch_run.describe()}\n{ours.describe()}"
    assert torch_run.attempts() == {a: [0, 1] for a in range(max_restarts + 1)}
    assert_same_workers(torch_run, ours)
    assert_same_console(torch_run, ours)
    root = assert_same_report(torch_run, ours)
    if "--raise" in fail:
        assert root == Failure(0, 0, 1, f"attempt_{max_restarts}/0/error.json",
                               f"RuntimeError: probe failure rank=0 attempt={max_restarts}")
    else:
        assert (root.rank, root.exitcode, root.error_file) == (1, 7, "<N/A>")


def _log_tree(outcome: Outcome) -> dict[str, object]:
    """{path relative to the run dir: content} for every file under ``--log-dir``."""
    assert outcome.log_dir is not None
    [run_dir] = list(outcome.log_dir.iterdir())  # <log_dir>/<run_id>_<random>
    assert run_dir.name.startswith(outcome.records[(0, 0)]["env"]["TORCHELASTIC_RUN_ID"] + "_")
    tree: dict[str, object] = {}
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        text: object = path.read_text()
        if path.name == "error.json":
            text = json.loads(str(text))
            text["message"]["extraInfo"].pop("timestamp")
        tree[str(path.relative_to(run_dir))] = text
    return tree


@pytest.mark.parametrize("launcher_args,fail", [
    pytest.param(["--redirects=3", "--tee=0:1", "--role=trainer"], [], id="redirect-all-tee-rank0-stdout"),
    # attempt 0: rank 0 raises under torch's @record (error.json in the log dir); attempt 1 passes
    pytest.param(["--redirects=0:1,1:2", "--tee=0:2,1:1", "--max-restarts=1"],
                 ["--fail-rank=0", "--fail-attempts=1", "--raise"], id="per-rank-redirects-restart"),
])
def test_log_dir_redirects_and_tee(tmp_path, launcher_args, fail):
    torch_run, ours = run_both(tmp_path, ["--standalone", "--nproc-per-node=2", *launcher_args],
                               [str(PROBE), *fail], log_dir=True)
    assert (torch_run.returncode, ours.returncode) == (0, 0), f"{torch_run.describe()}\n{ours.describe()}"
    assert torch_run.attempts() == {a: [0, 1] for a in range(2 if fail else 1)}
    assert_same_workers(torch_run, ours)
    assert_same_console(torch_run, ours)
    tree = _log_tree(torch_run)
    assert ("attempt_0/0/error.json" in tree) == bool(fail)
    assert _log_tree(ours) == tree


def test_gloo_all_reduce_sums(tmp_path):
    torch_run, ours = run_both(tmp_path, ["--standalone", "--nproc-per-node=3"], [str(PROBE), "--allreduce"])
    assert (torch_run.returncode, ours.returncode) == (0, 0), f"{torch_run.describe()}\n{ours.describe()}"
    assert ours.sums == torch_run.sums == {(0, r): {"rank": r, "world": 3, "sum": 6.0} for r in range(3)}
    assert_same_workers(torch_run, ours)


def test_signals_to_handle_reaches_workers(tmp_path):
    """torchrun sets TORCHELASTIC_SIGNALS_TO_HANDLE in its own environment (torch/distributed/
    launcher/api.py, ``os.environ[...] = config.signals_to_handle``), so every worker inherits
    it, and a torch launcher nested in a worker handles the same signals."""
    from torch.distributed.run import get_args_parser

    if "--signals-to-handle" not in get_args_parser()._option_string_actions:
        pytest.skip("this torch's torchrun has no --signals-to-handle (torch 2.4's has not): nothing to compare")
    torch_run, ours = run_both(tmp_path, ["--standalone", "--nproc-per-node=1",
                                          "--signals-to-handle=SIGTERM,SIGUSR1"], [str(PROBE)])
    assert (torch_run.returncode, ours.returncode) == (0, 0), f"{torch_run.describe()}\n{ours.describe()}"
    seen = {o.name: o.records[(0, 0)]["env"].get(SIGNALS_ENV) for o in (torch_run, ours)}
    assert seen == {"torchrun": "SIGTERM,SIGUSR1", "ours": "SIGTERM,SIGUSR1"}
