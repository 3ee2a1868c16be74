"""``elastic-run``'s flags under thousands of Faker-made bad values.

In process: ``harness.run.cli(argv)`` (the console script's body) runs everything up to
the launch: argparse, ``config_from_args``, the signal list, and the rendezvous handler
for one node (no socket is opened to build it); for several nodes the backend's
settings and endpoint are checked as its handler would, without dialling the endpoint
(a Faker hostname must not cost a DNS timeout). Then it stops (``_Launched``). Each
input must end accepted or as one line on stderr with a non-zero exit code.

A few real ``elastic-run`` subprocesses check the same end to end.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SCRIPTS, run_elastic
from tests.fuzz._bad import Bad, cases, count, replay_hint, run_target

SCRIPT = str(SCRIPTS / "sleeper.py")
#: (not SIGCHLD: handled, it would stop this test process at its next child's exit)
SIGNALS = ["SIGTERM", "SIGINT", "SIGKILL", "SIGSTOP", "SIGSEGV", "SIGUSR1", "SIGRTMIN",
           "CTRL_C_EVENT", "sigterm", "15", "SIGTERM,SIGKILL", " SIGHUP ", ""]
RDZV_KEYS = ["join_timeout", "last_call_timeout", "close_timeout", "keep_alive_interval",
             "heartbeat_timeout", "keep_alive_max_attempt", "timeout", "read_timeout", "is_host",
             "protocol", "rank", "store_type", "use_libuv"]


class _Launched(BaseException):
    """Raised where the agent would start: the config was accepted (not an Exception,
    so nothing on the way catches it)."""


def _stop_at_launch(config: Any, cmd: Any, args: list[Any]) -> Any:
    """``run_agent``'s stand-in: what ``build_agent`` checks, short of starting anything
    (the agent itself would open pipes and, for ``zygote``, start a warm interpreter)."""
    from harness.agent import WorkerSpec
    from harness.rendezvous import RendezvousParameters, get_rendezvous_handler
    from harness.rendezvous._c10d import C10dSettings
    from harness.rendezvous._registry import C10D_DEFAULT_PORT, _endpoint

    params = RendezvousParameters(
        backend=config.rdzv_backend, endpoint=config.rdzv_endpoint, run_id=config.run_id or "x",
        min_nodes=config.min_nodes, max_nodes=config.max_nodes, local_addr=config.local_addr,
        **config.rdzv_configs)
    solo = config.rdzv_backend == "static" or (config.rdzv_backend == "c10d" and config.max_nodes == 1)
    if solo:  # etcd's handler, and c10d's for several nodes, would dial the endpoint
        handler = get_rendezvous_handler(params)  # nothing opened until next_rendezvous
        WorkerSpec(role=config.role, local_world_size=config.nproc_per_node, entrypoint=cmd,
                   args=tuple(args), rdzv_handler=handler, max_restarts=config.max_restarts,
                   monitor_interval=config.monitor_interval, local_addr=config.local_addr,
                   event_log_handler=config.event_log_handler,
                   virtual_local_rank=config.virtual_local_rank)
        handler.shutdown()
        raise _Launched
    if config.rdzv_backend == "c10d":
        C10dSettings.from_params(params)
    _endpoint(params, C10D_DEFAULT_PORT)  # required by both
    raise _Launched


def _rdzv_conf(b: Bad) -> str:
    pairs = [f"{b.rng.choice(RDZV_KEYS + [b.any()])}={b.rng.choice([b.number, b.any])()}"
             for _ in range(b.rng.randint(1, 3))]
    return b.rng.choice([",".join(pairs), b.any()])


def _ranks(b: Bad) -> str:
    return ",".join(b.number() for _ in range(b.rng.randint(1, 3)))


def _std(b: Bad) -> str:
    return b.rng.choice([b.number, lambda: f"{b.number()}:{b.number()},{b.number()}:3", b.any])()


#: each flag with what is worth feeding it (besides anything at all)
FLAG_VALUES: dict[str, Any] = {
    "--nnodes": lambda b: b.rng.choice([b.number, lambda: f"{b.number()}:{b.number()}",
                                        lambda: f"1:{b.number()}"])(),
    "--nproc-per-node": lambda b: b.rng.choice([b.number, lambda: b.rng.choice(["cpu", "gpu", "auto"])])(),
    "--max-restarts": Bad.number,
    "--monitor-interval": Bad.number,
    "--rdzv-endpoint": Bad.endpoint,
    "--rdzv-conf": _rdzv_conf,
    "--rdzv-backend": lambda b: b.rng.choice(["c10d", "static", "etcd", "etcd-v2", b.any()]),
    "--rdzv-id": Bad.any,
    "--standalone": None,
    "--master-addr": lambda b: b.rng.choice([b.hostname, b.ipv4, b.ipv6])(),
    "--master-port": Bad.port,
    "--node-rank": Bad.number,
    "--local-addr": lambda b: b.rng.choice([b.hostname, b.ipv4, b.ipv6])(),
    "--log-dir": Bad.path,
    "--redirects": _std,
    "--tee": _std,
    "--local-ranks-filter": _ranks,
    "--signals-to-handle": lambda b: ",".join(b.rng.choices(SIGNALS, k=b.rng.randint(1, 3))),
    "--shutdown-timeout": Bad.number,
    "--exit-barrier-timeout": Bad.number,
    "--start-method": lambda b: b.rng.choice(["spawn", "fork", "zygote", b.any()]),
    "--role": Bad.any,
    "--event-log-handler": Bad.any,
    "--logs-specs": Bad.any,
    "--numa-binding": Bad.any,
    "--duplicate-stdout-filters": Bad.any,
    "-m": None,
    "--no-python": None,
    "--run-path": None,
    "--virtual-local-rank": None,
}


def bad_argv(b: Bad) -> list[str]:
    """A valid command line with one to four flags set to bad (or odd) values."""
    argv: list[str] = []
    for flag in b.rng.sample(sorted(FLAG_VALUES), b.rng.randint(1, 4)):
        make = FLAG_VALUES[flag]
        if make is None:
            argv.append(flag)
            continue
        value = b.clean(make(b) if b.rng.random() < 0.7 else b.any())
        if flag.startswith("--") and b.rng.random() < 0.5:
            flag = flag.replace("-", "_")[:2].replace("_", "-") + flag[2:].replace("-", "_")
        argv += [f"{flag}={value}"] if b.rng.random() < 0.5 else [flag, value]
    script = SCRIPT if b.rng.random() < 0.6 else b.rng.choice([b.path, b.any])()
    return [*argv, b.clean(script), *(b.any() for _ in range(b.rng.randint(0, 2)))]


def _one_line(text: str) -> bool:
    lines = [line for line in text.splitlines() if not line.startswith("[elastic-run] WARNING")]
    return len(lines) == 1


def check_in_process(argv: list[str]) -> str:
    """``cli(argv)`` up to the launch: 'accepted', or 'error' after checking the error."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            from harness.run import cli

            code: Any = cli(argv)
        except _Launched:
            return "accepted"
        except SystemExit as e:  # argparse
            code = e.code
    assert code not in (0, None), f"exit code {code!r} without a launch"
    assert _one_line(err.getvalue()), f"stderr is not one line:\n{err.getvalue()}"
    return "error"


@pytest.fixture
def launch_stopped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import harness.launch

    monkeypatch.setattr(harness.launch, "run_agent", _stop_at_launch)
    monkeypatch.chdir(tmp_path)  # a relative --log-dir or script lands here
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for name in list(os.environ):
        if name.startswith("PET_"):
            monkeypatch.delenv(name)


def test_flags_in_process(launch_stopped: None) -> None:
    outcomes = run_target("elastic-run flags", 2000, bad_argv, check_in_process, nul=False)
    assert len(outcomes) == 2, outcomes  # both accepted and refused were reached


def test_pet_environment_in_process(launch_stopped: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``PET_<FLAG>`` is read when the parser is built: a bad value must fail the same way."""
    names = [f.lstrip("-").replace("-", "_").upper() for f in FLAG_VALUES if len(f) > 2]

    def make(b: Bad) -> tuple[str, str]:
        return b.rng.choice(names), b.clean(b.rng.choice([b.number, b.any])())

    def check(setting: tuple[str, str]) -> str:
        with monkeypatch.context() as env:
            env.setenv(f"PET_{setting[0]}", setting[1])
            return check_in_process([SCRIPT])

    run_target("PET_* environment", 400, make, check, nul=False)


END_TO_END = 6
#: flags an accepted one-node run can take without needing a peer, a GPU or many workers
RUNNABLE = ("--monitor-interval", "--shutdown-timeout", "--exit-barrier-timeout", "--max-restarts",
            "--redirects", "--tee", "--local-ranks-filter", "--role", "--signals-to-handle",
            "--start-method", "--log-dir", "--event-log-handler", "--rdzv-id", "--virtual-local-rank")


def runnable_argv(b: Bad) -> list[str]:
    """Like ``bad_argv``, with the one-node flags only, every value drawn from the flag's own
    kind of odd (so that most are accepted and get run)."""
    argv: list[str] = []
    for flag in b.rng.sample(RUNNABLE, b.rng.randint(1, 3)):
        make = FLAG_VALUES[flag]
        argv += [flag] if make is None else [f"{flag}={b.clean(make(b))}"]
    return [*argv, SCRIPT]


def _refused(case: int) -> list[str]:
    return next(argv for i, b in cases(count(2000), nul=False)
                for argv in [bad_argv(b)] if i % END_TO_END == case and SCRIPT in argv
                and check_in_process(argv) == "error")  # refused for a flag, not the script


def _accepted(case: int) -> list[str]:
    return next(argv for i, b in cases(count(2000), nul=False)
                for argv in [runnable_argv(b)] if i % END_TO_END == case
                and check_in_process(argv) == "accepted")


@pytest.mark.parametrize("case", range(END_TO_END))
@pytest.mark.parametrize("kind", ["refused", "accepted"])
def test_flags_end_to_end(kind: str, case: int, launch_stopped: None, tmp_path: Path) -> None:
    """The real console script, on inputs the in-process run refused (the same refusal:
    one line on stderr, a non-zero exit, in bounded time) and on one-node inputs it
    accepted, which now run a script that succeeds: exit 0, or one line saying why not.
    The last accepted case meets its failure only when it runs: a ``--log-dir`` past NAME_MAX."""
    quick = tmp_path / "quick.py"
    quick.write_text("pass\n")
    if kind == "accepted" and case == END_TO_END - 1:
        argv = ["--log-dir", str(tmp_path / ("x" * 300)), SCRIPT]
    else:
        argv = _refused(case) if kind == "refused" else _accepted(case)
    argv = [str(quick) if a == SCRIPT else a for a in argv]
    hint = replay_hint(f"elastic-run end to end ({kind})", case, argv)
    try:
        result = run_elastic(*argv, env={"OMP_NUM_THREADS": "1"}, timeout=60, cwd=str(tmp_path))
    except Exception as e:
        pytest.fail(f"{hint}\n{e}")
    print(f"\nelastic-run {argv!r}\n-> {result.returncode}: {result.stderr.strip()}")
    if kind == "refused":
        assert result.returncode != 0, hint
    if result.returncode != 0:
        assert _one_line(result.stderr), f"{hint}\n{result.stderr}"
