"""Shared fixtures: leak checks after every test, and a runner for ``elastic-run``."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

SCRIPTS = Path(__file__).parent / "scripts"
#: pytest plugins installed beside ours (faker for the fuzz suite, anyio with the frameworks'
#: httpx) that no session of ours uses. Each loads at every pytest start: faker's alone costs
#: ~0.4 s of a ~0.8 s start, and the suite starts sessions of its own (pytester, side by side,
#: on hosts) about a hundred times. The fuzz suite builds its own ``Faker`` and asks for no
#: fixture of faker's plugin.
UNUSED_PLUGINS = ("no:faker", "no:anyio")
_PRIVATE_TMP: str | None = None
_IMPORT_CACHE: str | None = None
_SHARED_POOL: Any = None  # the warm_pool fixture's, while it is open


def unused_plugin_args() -> list[str]:
    """``-p no:NAME`` for each of ``UNUSED_PLUGINS``: for a session a test starts itself."""
    return [arg for name in UNUSED_PLUGINS for arg in ("-p", name)]


@pytest.fixture
def pytester(pytester: pytest.Pytester) -> pytest.Pytester:
    """pytest's own, its sessions without ``UNUSED_PLUGINS`` (``-p``, in and out of process)."""
    pytester.plugins.extend(UNUSED_PLUGINS)
    return pytester


def pytest_configure(config: pytest.Config) -> None:
    """Give this test process (one per xdist worker) a private TMPDIR, so the temp-dir
    leak check sees only what this process's tests created; one BLAS thread for every
    process the suite starts."""
    global _PRIVATE_TMP, _IMPORT_CACHE
    if not hasattr(config, "workerinput") and "HARNESS_IMPORT_CACHE" not in os.environ:
        # the zygotes' import cache (harness.procs._import_cache) of this run alone, shared by
        # its xdist workers (they inherit the environment) and removed with it: the suite
        # neither reads nor fills the user's ~/.cache, so a run does not depend on the last
        _IMPORT_CACHE = tempfile.mkdtemp(prefix="pytest-elastic-imports-")
        os.environ["HARNESS_IMPORT_CACHE"] = _IMPORT_CACHE
    # numpy's OpenBLAS (torch imports numpy) starts a thread per core at import, and each
    # spins before it sleeps: 0.24 s of CPU per `import torch` on 2 cores (1.99 -> 1.75 s,
    # 5 alternated imports each), paid by every torchrun, spawned worker and zygote the suite
    # starts, under its launchers and ours alike. None of the suite's work is numpy's BLAS.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _PRIVATE_TMP = tempfile.mkdtemp(prefix="pytest-elastic-tmp-")
    os.environ["TMPDIR"] = _PRIVATE_TMP
    tempfile.tempdir = _PRIVATE_TMP


#: fixtures whose tests start whole pytest sessions or sshd hosts (the suite's longest: 5-17 s)
_SESSIONS = frozenset({"pytester", "lab"})
#: fixtures whose tests run jobs (1-8 s, mostly waiting on bounds and leases)
_JOBS = frozenset({"warm_pool", "warm_workers", "nodes", "etcd_endpoint", "elastic_cluster"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first, in their files' order otherwise. Why: under ``--dist
    worksteal`` the worker that ends its half first takes tests from the end of the other's,
    and a run ends when its last test does; a 10 s test dealt last kept one of two cores
    idle for 10 s. Longest first, what is left to take at the end is short. Deterministic,
    so that every xdist worker orders the same collection the same way."""
    def weight(item: pytest.Item) -> int:
        names = set(getattr(item, "fixturenames", ()))
        return 2 if names & _SESSIONS else 1 if names & _JOBS else 0

    items.sort(key=weight, reverse=True)  # stable: file order within each weight


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The fuzz suite's inputs tried per target and its seed (``tests/fuzz/conftest.py``
    puts them in each report's user_properties; here, not there: under xdist only this
    conftest is loaded in the controller)."""
    lines = [value for key in ("passed", "failed") for report in terminalreporter.stats.get(key, [])
             for name, value in getattr(report, "user_properties", []) if name == "fuzz"]
    if lines:
        terminalreporter.section("fuzz: inputs tried")
        for line in lines:
            terminalreporter.line(line)


def _sweep_killed_owners() -> None:
    """Remove what the harness processes some tests SIGKILL on purpose left behind (their
    mounts, namespaces, job cgroups). The harness removes a dead owner's leftovers when the
    next harness starts one of its own, and after the session's last test there is none."""
    from harness.sim.net.names import sweep_dead_owners as sweep_namespaces
    from harness.sim.resources.cgroups import sweep_dead_owners as sweep_cgroups
    from harness.sim.storage.mount import sweep as sweep_mounts

    sweep_mounts()
    sweep_namespaces()
    sweep_cgroups()


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil
    from multiprocessing import util

    _sweep_killed_owners()

    if _IMPORT_CACHE:
        shutil.rmtree(_IMPORT_CACHE, ignore_errors=True)
    if _PRIVATE_TMP:
        # after multiprocessing removes its own pymp-* dir from it (exitpriority -100)
        util.Finalize(None, shutil.rmtree, args=(_PRIVATE_TMP,), kwargs={"ignore_errors": True},
                      exitpriority=-101)


def _temp_trees() -> set[str]:
    tmp = tempfile.gettempdir()
    return set(glob.glob(os.path.join(tmp, "elastic_*")))


def _cgroups() -> set[str]:
    """Job cgroups this process made (``harness.sim.resources``) that are still there."""
    from harness.sim.resources.cgroups import CgroupSupport, probe

    support = probe()
    if not isinstance(support, CgroupSupport):
        return set()
    return {path for base in support.distinct_bases()
            for path in glob.glob(os.path.join(base, f"elastic_{os.getpid()}_*"))}


@pytest.fixture(autouse=True)
def no_github_output():
    """The sessions our tests start (pytester) inherit this environment: under GitHub
    Actions they would annotate the real run and append to its real step summary. Off for
    them; a test that checks that output turns it on with its own summary file. A
    MonkeyPatch of its own, not the ``monkeypatch`` fixture: requested here, that one would
    be set up before ``no_leaks`` and undone after it, so a test's patched ``tempfile.tempdir``
    would still be in place when ``no_leaks`` looks for leftovers."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTEST_ELASTIC_GITHUB", "false")
        patch.delenv("GITHUB_STEP_SUMMARY", raising=False)
        yield


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail the test if it left a child process, one of our temp dirs, a job cgroup or a
    job's mounted filesystem behind."""
    me = psutil.Process()
    before_children = {p.pid for p in me.children(recursive=True)}
    before_dirs = _temp_trees()
    before_cgroups = _cgroups()
    before_mounts = _our_mounts()
    yield
    deadline = time.monotonic() + 5
    while True:
        leaked = [p for p in me.children(recursive=True)
                  if p.pid not in before_children and _alive(p)]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for proc in leaked:
        proc.kill()
    assert not leaked, f"test left processes behind: {[(p.pid, _cmd(p)) for p in leaked]}"
    new_dirs = _temp_trees() - before_dirs
    assert not new_dirs, f"test left temp dirs behind: {sorted(new_dirs)}"
    new_cgroups = _cgroups() - before_cgroups
    assert not new_cgroups, f"test left cgroups behind: {sorted(new_cgroups)}"
    mounted = _our_mounts() - before_mounts
    assert not mounted, f"test left job filesystems mounted: {sorted(mounted)}"


def _our_mounts() -> set[str]:
    """Mount points of this process's job filesystems (harness.sim.storage) mounted now."""
    from harness.sim.storage.mount import harness_mounts

    return {point for point, fsname in harness_mounts() if fsname.startswith(f"harness-{os.getpid()}-")}


# multiprocessing's per-parent helpers: started once, they exit when this process does
_MP_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """Headless Chromium over its DevTools pipe (``tests/browser.py``), closed after the test."""
    from tests.browser import Browser

    opened = Browser(tmp_path / "profile")
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture(scope="session")
def warm_pool() -> Any:
    """One ``WarmPool`` per test process, for the tests that run jobs: ``Cluster(...,
    pool=warm_pool)``, as the plugin gives its session's elastic tests one. Why: a cluster
    without a pool starts a private one, a zygote that imports torch and a node fork server,
    about 1.2 s of CPU each time (0.35 s for a whole 2-node job on a warm pool, measured with
    cpuacct); a hundred clusters in the suite paid it on a 2-core runner. Tests about a
    pool's own life (ownership, close, the import cache learned by a fresh zygote) keep
    private pools. The leak check below lets this pool's own processes live between tests
    (``WarmPool.pids``), not what they forked: a worker or a node agent left behind still
    fails its test."""
    global _SHARED_POOL
    from harness import WarmPool

    with WarmPool() as pool:
        _SHARED_POOL = pool
        try:
            yield pool
        finally:
            _SHARED_POOL = None


@pytest.fixture
def warm_workers(warm_pool: Any) -> dict[str, str]:
    """The environment that has a ``python -m harness.run`` agent fork its workers from
    ``warm_pool``'s zygote (``--start-method=zygote`` through ``PET_START_METHOD``, and
    ``$HARNESS_ZYGOTE``), for tests about the rendezvous or the agent rather than about how
    a worker starts. torchrun's default, spawn, starts a fresh interpreter that imports
    torch for every worker of every round, about 1 s of CPU each: it made such tests the
    suite's heaviest (test_c10d.py and test_fencing.py: 69 s of CPU in 75 s run serially;
    10 s in 40 s with these). Workers still die with their agent: the zygote kills an
    agent's workers when its connection closes. The spawn path keeps its own tests (the
    CLI's, the start methods', torchrun parity: tests/runtime, tests/differential)."""
    from harness.procs import ZYGOTE_ENV

    return {ZYGOTE_ENV: warm_pool.address(), "PET_START_METHOD": "zygote"}


def _alive(proc: psutil.Process) -> bool:
    try:
        if proc.status() == psutil.STATUS_ZOMBIE or (_SHARED_POOL is not None and proc.pid in _SHARED_POOL.pids()):
            return False
        return not any(h in " ".join(proc.cmdline()) for h in _MP_HELPERS)
    except psutil.NoSuchProcess:
        return False


def survivors(pids: list[int], timeout: float) -> list[int]:
    """The pids still running (not gone, not a zombie) after waiting up to ``timeout``
    seconds for all of them to die. A pid may already be gone when this is called: that
    counts as dead, never as an error (psutil.Process(pid) would raise)."""
    deadline = time.monotonic() + timeout
    while True:
        running = [pid for pid in pids if _running(pid)]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cmd(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:120]
    except psutil.Error:
        return "?"


def run_elastic(*args: str, env: dict | None = None, timeout: float = 60,
                cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m harness.run ARGS`` and return its completed process (text)."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("TORCHELASTIC_ERROR_FILE", None)
    return subprocess.run([sys.executable, "-m", "harness.run", *args], capture_output=True,
                          text=True, env=full_env, timeout=timeout, cwd=cwd)


@pytest.fixture
def scripts() -> Path:
    return SCRIPTS


def printed_schedule(result: Any) -> list[str]:
    """The fault schedule a pytester session printed for its failing chaos test."""
    block = result.stdout.str().split("fault schedule:")[1].split("reproduce with:")[0]
    return [line.strip() for line in block.strip().splitlines() if "@" in line]
