"""Flake bench: how often the README's main job goes red on this machine, and why.

    python bench/flake.py [--runs 10] [--busy K] [--suite] [--pytest-args "-k scale_down"]
                          [--faults KINDS ...] [--timeout S] [--logs DIR]

Runs ``python -m pytest scenarios --elastic-chaos --elastic-faults=all -n 2`` (``--suite``: the test suite,
``python -m pytest -n 2``) from the repo root with the interpreter that runs the bench,
``--runs`` times one after the other, plus ``-rfE`` (the red items' ``FAILED``/``ERROR``
lines) and ``-p no:cacheprovider`` (the bench leaves the user's ``--lf`` state alone).
``--busy K`` keeps K pure-Python busy loops running beside it, to see what CPU starvation
does to the red rate. Per run it prints one line: red or green, the wall time, the chaos
seed from the header (``elastic: chaos=on seed=N ...``) and every red item with a cause
(``classify``: false-liveness, harness, hang, invariant, timing, other); at the end the totals, the
red items by test, and each red run's seed with the command that replays it. The full
output of every red run is kept under ``--logs``.

``--faults KINDS`` runs the main job under those chaos kinds (``--elastic-faults``); given
several times, each is a group of ``--runs`` runs, and the totals, red items and wall times
are printed per group. ``all`` is every chaos kind together, ``each`` one group per kind
alone, ``default`` the plugin's default kinds; the last table gives each group's median and
slowest run against the ``default`` group's median (a group run without it: no ratio).

No torchrun side, unlike the other benches here: what is measured is our own suite's red
rate, and torchrun has no suite of ours to run; a torchrun "flake rate" of different jobs
would compare nothing.

The classification reads the text pytest printed for the item, so it is a heuristic. Read
the kept log before acting on a cause.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _common import isolate_tmpdir, median, print_table, sweep_killed_runs  # noqa: E402

#: the temp root before ``isolate_tmpdir`` moves TMPDIR: a run's own temp dir goes straight
#: under it, not two levels down (see ``run_tmpdir``)
SYSTEM_TMP = tempfile.gettempdir()

#: README.md's main job, after "python -m pytest"
MAIN_JOB = ("scenarios", "--elastic-chaos", "--elastic-faults=all", "-n", "2")
SUITE = ("-n", "2")  # README.md's test command
BENCH_ARGS = ("-rfE", "-p", "no:cacheprovider")
MAIN_TIMEOUT_S = 1800.0
SUITE_TIMEOUT_S = 3600.0
#: after Ctrl-C, how long pytest (sent SIGINT) gets to tear its clusters down before SIGKILL
INTERRUPT_GRACE_S = 20.0
DEFAULT_LOGS = HERE / "flake-logs"
WHOLE_RUN = "(whole run)"

CAUSES = ("false-liveness", "harness", "hang", "invariant", "timing", "other")

# -- classifying one red item's text (pure; tests/unit/test_flake_classify.py) -------------

#: harness.sim.truth.invariants._check_no_overlap: a worker of an older round outlived the start
#: of a newer one. The check already excuses nodes a fault killed or cut off, so what is
#: left is a node the others re-formed without while it was alive: a liveness misjudgement
_OVERLAP = re.compile(r"started while .+ was still alive")
#: a node fenced itself (harness.rendezvous._keeper: "fenced: no answer from the rendezvous
#: store..."), the others dropped it (_liveness.change_reason: "lost <label>-<index>"), or an
#: agent found the rendezvous closed behind it. Not "lost the store"/"lost 1.5 s to ...".
_LIVENESS_SIGNS = re.compile(r"\bfenced:|\blost (?!the\b|fsynced\b)[A-Za-z][\w.]*-\d+\b|RendezvousClosedError")
#: faults after which fencing or losing a node is the right answer (timeline, scenario and
#: chaos spellings, old and new, and the classes); a slowed node (slow_node) is not one
_LIVENESS_FAULTS = re.compile(
    r"\b(?:partition|packet_loss|link_down|store_host_loss|kill_store_host|node_freeze|freeze_node"
    r"|node_kill|kill_node|agent_kill|kill_agent|node_leave|remove_node"
    r"|Partition|PacketLoss|LinkDown|StoreHostKill|StoreHostLoss|NodeFreeze|NodeKill|AgentKill"
    r"|NodeRemove|NodeLeave)\b")
_HANG = re.compile(
    r"did not finish within|still running|\bstalled: no event"
    r"|\bnot within [\d.]+ ?s|did not \w+(?: [\w.]+)* within [\d.]+ ?s"
    r"|\bTimeout\b|TimeoutError|timed out")  # Job.wait (a hang, a stall), the suite's own waits, pytest-timeout
_INVARIANT = re.compile(r"invariant\(s\) violated|InvariantViolation")
_TIMING = re.compile(
    r"\bworld[ _]sizes\b|final world size|\bexpected\b[^\n]*\bgot\b|FaultNotFired|never fired"
    r"|\b(?:resumed|recovered) after [\d.]+ ?s > |never resumed|restart\(s\), expected"
    r"|fault\(s\) fired .*expected|< min_goodput|step time grew")


#: a Python error raised where pytest shows the failing line (``E   ...``): a bundled scenario
#: passes its settings checked, so a ``ConfigError`` there is a state the harness got wrong
_HARNESS = re.compile(r"^E\s+(?:[\w.]+\.)?(?:ConfigError|AttributeError|KeyError|TypeError|IndexError|NameError"
                      r"|UnboundLocalError|RecursionError)\b", re.M)


def classify(text: str) -> str:
    """The cause of one red item from the text pytest printed for it (its failure section),
    the first that fits, in this order:

    * ``false-liveness``: a live node taken for dead: the overlap invariant, or a fence, a
      lost node or a closed rendezvous in a text that names no fault that kills, freezes,
      removes or cuts off a node (there those are the job doing its work);
    * ``harness``: a Python error the harness's own code raised (``AttributeError``,
      ``KeyError``, a ``ConfigError`` about a node it started itself...): a bug of the
      harness, whatever else the text says;
    * ``hang``: something did not finish in its time (``Job.wait``'s "did not finish
      within", "still running", pytest-timeout);
    * ``invariant``: any other broken invariant;
    * ``timing``: an expectation about time, latency, world sizes or restart and fault
      counts did not hold (a scenario's ``[expect]``, "expected ... got", FaultNotFired);
    * ``other``: the rest (an ordinary assertion, a leak, a crash of pytest-xdist's worker).

    Liveness comes first because a node wrongly dropped usually surfaces as something else
    (a hang, a wrong world size), and it is the one a flake bench is after.
    """
    if _OVERLAP.search(text):
        return "false-liveness"
    if _LIVENESS_SIGNS.search(text) and not _LIVENESS_FAULTS.search(text):
        return "false-liveness"
    if _HARNESS.search(text):
        return "harness"
    if _HANG.search(text):
        return "hang"
    if _INVARIANT.search(text):
        return "invariant"
    if _TIMING.search(text):
        return "timing"
    return "other"


# -- reading one run's output (pure) -------------------------------------------------------

_SEED = re.compile(r"^elastic: chaos=on seed=(\d+)\b", re.M)
_BLOCK = re.compile(r"^=+ (.+?) =+$")  # "==== FAILURES ====", "==== short test summary info ===="
_TITLE = re.compile(r"^_+ (.+?) _+$")  # "____ scenario: worker_sigkill ____"
_RED_LINE = re.compile(r"^(FAILED|ERROR) (\S.*?)(?: - .*)?$")
_TITLE_PREFIX = re.compile(r"^ERROR (?:at (?:setup|call|teardown) of|collecting) ")


@dataclass
class RedItem:
    """A test that went red in one run: its node id, what pytest printed for it, its cause."""

    nodeid: str
    text: str
    cause: str = ""
    replay: str | None = None  # its "reproduce with:" line, when it printed one


def parse_seed(output: str) -> int | None:
    """The session's chaos seed from its header (the first one: a pytester run inside a test
    prints headers of its own later); None without chaos."""
    match = _SEED.search(output)
    return int(match[1]) if match else None


def title_matches(title: str, nodeid: str) -> bool:
    """Whether a ``____ title ____`` line heads ``nodeid``'s section: pytest titles a section
    with the item's domain (``TestClass.test_name[param]``; a scenario: ``scenario: name``),
    an error with "ERROR at setup of ..." and a collection error with "ERROR collecting path"."""
    title = _TITLE_PREFIX.sub("", title)
    path, _, rest = nodeid.partition("::")
    parts = rest.split("::") if rest else []
    last = parts[-1] if parts else path
    return title in {nodeid, path, last, ".".join(parts)} or title.endswith(f": {last}")


def red_items(output: str) -> list[RedItem]:
    """Every red item of a run, once each (a test that failed and then errored in teardown
    is one item with both texts), in the order pytest listed them, each with its section.

    The ``FAILED``/``ERROR`` lines are read from the last "short test summary info" block
    (a failing pytester test shows an inner run's before it). A section runs from its title
    to the next claimed title or ``====`` line, so a pytester run's captured output is cut
    at its first ``====`` and the item's own message, printed before it, is what stays."""
    lines = output.splitlines()
    summary = max((i for i, line in enumerate(lines) if _is_block(line, "short test summary info")), default=None)
    if summary is None:
        return []
    reds = [m[2] for line in lines[summary + 1:] if (m := _RED_LINE.match(line))]
    starts = _claim_titles(lines[:summary], reds)
    items: dict[str, RedItem] = {}
    for nodeid, start in zip(reds, starts, strict=True):
        text = _section(lines, start, starts, summary) if start is not None else _summary_message(lines, nodeid)
        item = items.setdefault(nodeid, RedItem(nodeid, ""))
        item.text = f"{item.text}\n{text}" if item.text else text
    for item in items.values():
        item.cause = classify(item.text)
        item.replay = replay_line(item.text)
    return list(items.values())


def _is_block(line: str, name: str | None = None) -> bool:
    match = _BLOCK.match(line)
    if match is None:
        return False
    return name is None or match[1] == name


def _claim_titles(lines: Sequence[str], nodeids: Sequence[str]) -> list[int | None]:
    """For each red node id in order, the line of the first unclaimed title that heads it
    (pytest prints a kind's sections, ERRORS or FAILURES, in the order of its summary lines,
    so two tests of one name in two files get their own sections)."""
    titles = [(i, m[1]) for i, line in enumerate(lines) if (m := _TITLE.match(line))]
    claimed: set[int] = set()
    found: list[int | None] = []
    for nodeid in nodeids:
        line = next((i for i, title in titles if i not in claimed and title_matches(title, nodeid)), None)
        if line is not None:
            claimed.add(line)
        found.append(line)
    return found


def _section(lines: Sequence[str], start: int, starts: Sequence[int | None], end: int) -> str:
    """The lines under the title at ``start``, up to the next claimed title, ``====`` line or ``end``."""
    later = [s for s in starts if s is not None and start < s < end]
    stop = min([*later, end])
    body = []
    for line in lines[start + 1:stop]:
        if _is_block(line):
            break
        body.append(line)
    return "\n".join(body)


def _summary_message(lines: Sequence[str], nodeid: str) -> str:
    """No section (``--tb=no``, or none found): the summary line's own message."""
    return next((line for line in reversed(lines) if line.startswith(("FAILED ", "ERROR ")) and nodeid in line), nodeid)


def replay_line(text: str) -> str | None:
    """The command under a failure's "reproduce with:" (the plugin prints one per chaos item)."""
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.strip() == "reproduce with:":
            return lines[i + 1].strip()
    return None


# -- running -------------------------------------------------------------------------------


@dataclass
class Run:
    """One finished (or killed) run of the job."""

    number: int
    returncode: int
    wall_s: float
    output: str
    timed_out: bool = False
    seed: int | None = None
    items: list[RedItem] = field(default_factory=list)
    log: Path | None = None
    #: the pytest arguments it ran with past the job's own (``--elastic-faults``...)
    extra: list[str] = field(default_factory=list)

    @property
    def red(self) -> bool:
        return self.timed_out or self.returncode != 0


def _die_with_parent() -> None:
    """In the child before exec: SIGKILLed if the bench dies, even by SIGKILL (no finally
    runs then); the bench starts no threads, so a ``preexec_fn`` is safe here."""
    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))


def _run_child_setup() -> None:
    """In a run's pytest before exec: dies with the bench, and takes SIGINT as Ctrl-C even
    where the bench was started with SIGINT ignored. A shell script's background job (``cmd &``
    without job control) ignores SIGINT and SIGQUIT, and an ignored disposition is inherited
    across fork and exec: the run's pytest then ignored the SIGINT of a timeout or a Ctrl-C
    and sat out the whole grace, its clusters left to the SIGKILL."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _descendants(pid: int) -> list[int]:
    """``pid``'s process tree below it, from /proc (taken before a kill: once a parent dies
    its children are re-parented and can no longer be found this way)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rpartition(")")[2].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _end(proc: subprocess.Popen[bytes], first: int, grace: float) -> None:
    """Send ``first`` to the run's process group, give it ``grace`` seconds, then SIGKILL the
    group and every process of its tree (by pid: a harness node may sit in a session of its
    own) and reap the leader."""
    tree = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, first)
    try:
        if first != signal.SIGKILL:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
    finally:  # a second Ctrl-C during the grace still ends it
        tree += _descendants(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _kill(tree, signal.SIGKILL)
        proc.wait()


def run_once(cmd: Sequence[str], env: dict[str, str], timeout: float,
             grace: float = INTERRUPT_GRACE_S) -> tuple[int, float, str, bool]:
    """Run ``cmd`` from the repo root in its own session, output (stdout and stderr, in
    order) to a temp file: (returncode, wall seconds, output, timed out). On timeout, Ctrl-C
    or any other exception pytest gets SIGINT (it tears its clusters down) and ``grace``
    seconds before its processes are SIGKILLed; after a timeout, what a SIGKILLed run left
    (network namespaces, cgroups) is swept at once, not by the next run's start."""
    with tempfile.TemporaryFile() as out:
        started = time.monotonic()
        proc = subprocess.Popen(list(cmd), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_run_child_setup)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _end(proc, signal.SIGINT, grace)  # pytest closes its clusters, then what is left is killed
            sweep_killed_runs("flake")
        except BaseException:
            _end(proc, signal.SIGINT, grace)
            raise
        wall = time.monotonic() - started
        out.seek(0)
        return proc.returncode, wall, out.read().decode(errors="replace"), timed_out


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[list[int]]:
    """``count`` processes spinning ``while True: pass`` for as long as the block runs; each
    is SIGKILLed by its pid and reaped on the way out, whatever the way out."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL,
                                          start_new_session=True, preexec_fn=_die_with_parent))
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def job_env() -> dict[str, str]:
    """The bench's environment without the variables of a pytest, agent or worker around it
    (were the bench started from one, they would reconfigure the run)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PET_", "PYTEST_", "HARNESS_")) and k != "TORCHELASTIC_ERROR_FILE"}


def job_args(suite: bool, extra: Sequence[str]) -> list[str]:
    """The job's pytest arguments before ``extra``. With ``extra`` naming paths, those replace
    ``scenarios`` (the main job's only path), so a path list narrows the job as ``-k`` does."""
    if suite:
        return list(SUITE)
    return [a for a in MAIN_JOB if not (a == "scenarios" and names_paths(extra))]


def command(suite: bool, extra: Sequence[str]) -> list[str]:
    """The run's command line: the job, the bench's own arguments, then the user's."""
    return [sys.executable, "-m", "pytest", *job_args(suite, extra), *BENCH_ARGS, *extra]


#: pytest options whose value is the next argument and may name an existing path
_VALUE_OPTIONS = frozenset({"-k", "-m", "-p", "-c", "-o", "--ignore", "--ignore-glob", "--deselect", "--rootdir",
                            "--basetemp", "--junitxml", "--junit-xml", "--confcutdir", "--config-file",
                            "--override-ini", "--log-file", "--elastic-report"})


def _paths(args: Sequence[str]) -> list[str]:
    """The positional paths of ``args``: existing files or dirs relative to the repo root
    (``::test`` allowed), not options nor the values of ``_VALUE_OPTIONS``."""
    return [arg for before, arg in zip([None, *args], args, strict=False)
            if not arg.startswith("-") and before not in _VALUE_OPTIONS and (ROOT / arg.partition("::")[0]).exists()]


def names_paths(args: Sequence[str]) -> bool:
    """Whether ``args`` hold a positional path (``_paths``)."""
    return bool(_paths(args))


def runs_tests(suite: bool, args: Sequence[str]) -> bool:
    """Whether the runs are of the test suite, or of tests under ``tests/`` (``--pytest-args
    tests/hosts``): their conftest makes (and removes) a private TMPDIR of its own, and
    xdist's workers one more level each; a run TMPDIR of ours above those pushed the
    host tests' ssh control sockets (and ssh's temporary name beside each) past a Unix
    socket path's 108 bytes: "AF_UNIX path too long", a red that was the bench's."""
    return suite or any(Path(path.partition("::")[0]).parts[:1] == ("tests",) for path in _paths(args))


def run_tmpdir(number: int, suite: bool) -> str | None:
    """The temp dir a run gets: the main job a fresh one of its own, straight under the system
    temp root (what a run leaves does not pile up over ``--runs``); the suite none of ours
    (None: the system's), as under CI: its conftest makes and removes private ones, and a
    deeper TMPDIR pushed its AF_UNIX socket paths past the kernel's 108 bytes (the first
    ``--suite`` run here: multiprocessing's forkserver "AF_UNIX path too long", chromium
    aborting), a red that was the bench's, not the suite's."""
    return None if suite else tempfile.mkdtemp(prefix=f"fl{number}-", dir=SYSTEM_TMP)


def do_run(number: int, cmd: Sequence[str], timeout: float, suite: bool = False,
           grace: float = INTERRUPT_GRACE_S) -> Run:
    """One run, in the temp dir ``run_tmpdir`` gives (removed after), read back into a ``Run``."""
    env = job_env()
    tmpdir = run_tmpdir(number, suite)
    env["TMPDIR"] = tmpdir or SYSTEM_TMP
    try:
        rc, wall, output, timed_out = run_once(cmd, env, timeout, grace)
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
    run = Run(number, rc, wall, output, timed_out, parse_seed(output))
    if timed_out:  # killed before its summary: the whole run is the red item
        run.items = [RedItem(WHOLE_RUN, f"killed after {timeout:g} s", cause="hang")]
    elif rc != 0:  # no FAILED/ERROR line (pytest's internal error, a crash): its last words
        run.items = red_items(output) or [RedItem(WHOLE_RUN, output[-4000:], cause=classify(output[-4000:]))]
    return run


# -- printing ------------------------------------------------------------------------------


def run_line(run: Run, total: int) -> str:
    """One run: number, red/green, wall time, seed, red items with their causes."""
    state = "RED  " if run.red else "green"
    seed = f"seed {run.seed}" if run.seed is not None else "seed -"
    line = f"run {run.number:>{len(str(total))}}/{total}  {state}  {run.wall_s:7.1f} s  {seed}"
    if run.items:
        line += "  " + "; ".join(f"{i.nodeid} ({i.cause})" for i in run.items)
    return line


def keep_log(run: Run, directory: Path, cmd: Sequence[str]) -> Path:
    """A red run's full output, under a head that says what ran and how it was read."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"run-{run.number:03d}.log"
    serial = 1
    while path.exists():  # an earlier bench's log in the same --logs dir is kept, not overwritten
        serial += 1
        path = directory / f"run-{run.number:03d}-{serial}.log"
    head = [f"command: {shlex.join(cmd)}", f"returncode: {run.returncode}" + (" (timed out)" if run.timed_out else ""),
            f"wall: {run.wall_s:.1f} s", f"seed: {run.seed}",
            *(f"red: {i.nodeid} ({i.cause})" for i in run.items), "", ""]
    path.write_text("\n".join(head) + run.output)
    return path


def replay_command(seed: int | None, suite: bool, extra: Sequence[str]) -> str:
    """What replays a whole red run: the same job with its seed (the plugin derives every
    test's chaos from it and the test's id, so ``-n`` and the order do not matter)."""
    line = ["python", "-m", "pytest", *job_args(suite, extra), *extra]
    if seed is not None:
        line.append(f"--elastic-seed={seed}")
    return shlex.join(line)


def print_totals(runs: Sequence[Run]) -> None:
    """Runs, green, red (and the rate), red items per cause, median and max wall time."""
    red = [r for r in runs if r.red]
    causes = Counter(i.cause for r in red for i in r.items)
    walls = [r.wall_s for r in runs]
    rate = f"{len(red)} ({100 * len(red) / len(runs):.0f}%)" if runs else "0"
    print_table(["runs", "green", "red", *CAUSES, "median", "max"],
                [[str(len(runs)), str(len(runs) - len(red)), rate, *(str(causes[c]) for c in CAUSES),
                  f"{median(walls) or 0:.1f} s", f"{max(walls, default=0):.1f} s"]])


def print_red_items(runs: Sequence[Run]) -> None:
    """Per test that went red: in how many runs, and the causes."""
    by_test: dict[str, Counter[str]] = {}
    for run in runs:
        for item in run.items:
            by_test.setdefault(item.nodeid, Counter())[item.cause] += 1
    if not by_test:
        return
    print()
    rows = sorted(by_test.items(), key=lambda kv: -sum(kv[1].values()))
    print_table(["red item", "runs", "causes"],
                [[nodeid, str(sum(c.values())), ", ".join(f"{k} x{v}" for k, v in c.most_common())]
                 for nodeid, c in rows])


def print_red_runs(runs: Sequence[Run], suite: bool, extra: Sequence[str]) -> None:
    red = [r for r in runs if r.red]
    if not red:
        return
    print("\nred runs (seed, replay of the run, replay of each red chaos test, full output):")
    for run in red:
        print(f"  run {run.number}: seed {run.seed if run.seed is not None else '-'}")
        print(f"    {replay_command(run.seed, suite, run.extra or extra)}")
        for replay in dict.fromkeys(i.replay for i in run.items if i.replay):
            print(f"    {replay}")
        print(f"    log: {run.log}")


# -- main ----------------------------------------------------------------------------------


def fault_groups(specs: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``--faults`` values -> (label, pytest arguments) per group: ``default`` the plugin's
    default kinds, ``all`` every chaos kind, ``each`` one group per kind, anything else is
    passed as is (the last ``--elastic-faults`` wins over the main job's own)."""
    if not specs:
        return [("", [])]
    from harness.sim.schema import CHAOS_KINDS

    groups: list[tuple[str, list[str]]] = []
    from harness.sim.schema import DEFAULT_CHAOS_KINDS

    for spec in specs:
        if spec == "default":
            groups.append(("default", [f"--elastic-faults={','.join(DEFAULT_CHAOS_KINDS)}"]))
        elif spec == "all":
            groups.append(("all", [f"--elastic-faults={','.join(CHAOS_KINDS)}"]))
        elif spec == "each":
            groups += [(kind, [f"--elastic-faults={kind}"]) for kind in CHAOS_KINDS]
        else:
            groups.append((spec, [f"--elastic-faults={spec}"]))
    return groups


def print_groups(results: Sequence[tuple[str, Sequence[Run]]]) -> None:
    """Per group of ``--faults``: runs, red, red items with causes, median and max wall time,
    and both against the ``default`` group's median."""
    base = next((median([r.wall_s for r in runs]) for label, runs in results if label == "default"), None)
    rows = []
    for label, runs in results:
        walls = [r.wall_s for r in runs]
        mid, top = median(walls) or 0.0, max(walls, default=0.0)
        reds = Counter(f"{i.nodeid.rpartition('/')[2]} ({i.cause})" for r in runs for i in r.items)
        ratio = f"{mid / base:.2f}x / {top / base:.2f}x" if base else "-"
        rows.append([label, str(len(runs)), str(sum(r.red for r in runs)), f"{mid:.1f} s", f"{top:.1f} s", ratio,
                     ", ".join(f"{k} x{v}" for k, v in reds.most_common()) or "-"])
    print()
    print_table(["faults", "runs", "red", "median", "max", "vs default (median / max)", "red items"], rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of the job, one after the other (10)")
    parser.add_argument("--busy", type=int, default=0, metavar="K", help="busy-loop processes beside it (0)")
    parser.add_argument("--suite", action="store_true", help="run the test suite (pytest -n 2) instead")
    parser.add_argument("--pytest-args", default="", metavar="ARGS",
                        help='more pytest arguments, e.g. "-k scale_down" (paths replace scenarios)')
    parser.add_argument("--faults", action="append", default=[], metavar="KINDS",
                        help="chaos kinds of the main job (--elastic-faults): KINDS, 'all', 'each' or "
                             "'default'; repeat for several groups of --runs runs each")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help=f"per run; past it the run is killed and counted a hang "
                             f"({MAIN_TIMEOUT_S:g}; --suite {SUITE_TIMEOUT_S:g})")
    parser.add_argument("--interrupt-grace", type=float, default=INTERRUPT_GRACE_S, metavar="S",
                        help=f"after Ctrl-C or SIGTERM, how long the run's pytest may tear down before "
                             f"SIGKILL ({INTERRUPT_GRACE_S:g})")
    parser.add_argument("--logs", type=Path, default=None, metavar="DIR",
                        help="where red runs' output goes (bench/flake-logs/<time>)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.busy < 0:
        parser.error(f"--runs={args.runs} must be >= 1 and --busy={args.busy} >= 0")
    args.extra = shlex.split(args.pytest_args)
    if args.faults and args.suite:
        parser.error("--faults is for the main job, not --suite")
    args.timeout = args.timeout or (SUITE_TIMEOUT_S if args.suite else MAIN_TIMEOUT_S)
    args.logs = args.logs or DEFAULT_LOGS / time.strftime("%Y%m%d-%H%M%S")
    return args


def bad_setup(run: Run) -> bool:
    """pytest's usage error (4) or no tests collected (5): every run would say the same."""
    return run.returncode in (4, 5) and not run.timed_out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (a driver script's kill, CI's cancel) ends it as Ctrl-C does: the run's pytest
    # gets SIGINT and its grace, then the run's temp dir and the bench's own are removed.
    # SIGTERM's default action skipped both (a count stopped this way left them in /tmp)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    isolate_tmpdir()
    groups = fault_groups(args.faults)
    total = args.runs * len(groups)
    print(f"bench/flake.py: {args.runs} run(s) of {shlex.join(command(args.suite, args.extra))}"
          f"{f' per each of {len(groups)} fault groups' if args.faults else ''}, {args.busy} busy loop(s) "
          f"beside it, timeout {args.timeout:g} s; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
          f"red runs' output to {args.logs}", file=sys.stderr, flush=True)
    runs: list[Run] = []
    results: list[tuple[str, list[Run]]] = []
    interrupted = False
    with busy_loops(args.busy):
        try:
            for label, faults in groups:
                extra = [*faults, *args.extra]
                cmd = command(args.suite, extra)
                results.append((label, []))
                for _ in range(args.runs):
                    run = do_run(len(runs) + 1, cmd, args.timeout, runs_tests(args.suite, extra),
                                 args.interrupt_grace)
                    if bad_setup(run):
                        print(run.output[-3000:], file=sys.stderr)
                        print(f"pytest exited {run.returncode} (usage error or nothing collected): stopping",
                              file=sys.stderr)
                        return 2
                    run.extra = extra
                    if run.red:
                        run.log = keep_log(run, args.logs, cmd)
                    runs.append(run)
                    results[-1][1].append(run)
                    print(run_line(run, total) + (f"  [{label}]" if label else ""), flush=True)
        except KeyboardInterrupt:
            interrupted = True
            print(f"interrupted after {len(runs)} run(s)", file=sys.stderr)
    if not runs:
        return 130
    print()
    print_totals(runs)
    print_red_items(runs)
    if args.faults:
        print_groups([(label, group) for label, group in results if group])
    print_red_runs(runs, args.suite, args.extra)
    red = any(r.red for r in runs)
    print(f"\nfull output of the red runs: {args.logs}" if red else "\nno red run: no log kept")
    return 130 if interrupted else int(red)


if __name__ == "__main__":
    sys.exit(main())
