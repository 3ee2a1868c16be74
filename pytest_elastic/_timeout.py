"""pytest-timeout integration: elastic tests get a timeout, and a timed-out elastic test
shows the Python stacks of its live workers and has their process trees killed.

* At collection every elastic test without a ``@pytest.mark.timeout`` gets one: the
  marker's ``timeout=``, else ``--elastic-timeout`` (env/ini) when given, else the elastic
  default unless pytest-timeout already has a global timeout (which then stands). Scenario
  items get their job's ``timeout`` plus ``SCENARIO_GRACE_S``, so the job's own
  ``TimeoutError`` (with its timeline) comes first.
* Workers install ``faulthandler`` on ``SIGUSR1`` writing to ``$HARNESS_STACK_DUMP_DIR/
  <pid>.txt`` when that variable is set (``harness.procs._stackdump``; ``start_stack_dumps``
  sets it for the session). On timeout we signal every live worker of the test's clusters that
  has that file (a stopped one is continued for the dump and stopped again), wait up to
  ``DUMP_WAIT_S`` and collect what each wrote. Workers without the handler (``spawn`` of a
  script: nothing of ours runs before the script) are listed with their state only, never
  signalled (SIGUSR1 would kill them).
* ``signal`` method (pytest-timeout's default): the stacks become a report section, then
  pytest-timeout fails the test; the exception unwinds the test and the fixture's
  teardown (``Cluster.close``) kills every process tree. We do not kill from inside the
  handler: it may interrupt a ``Popen.wait`` that holds the lock ``close`` would need.
* ``thread`` method: pytest-timeout ends the process with ``os._exit``, so no teardown
  runs. From the timer thread we stop (SIGSTOP) every agent, so nothing restarts and the
  test stays where it hung (were the agents killed, the test could run on and pass while
  we report), SIGKILL every worker's process group, print the stacks to stderr
  (pytest-timeout shows the captured stderr), remove the clusters' temp dirs and the
  stack-dump dir, and hand over. At ``os._exit`` the stopped agents, the zygote and the
  store die by PDEATHSIG (SIGKILL; it ends stopped processes too).

Only the standard library at import; the harness and psutil are loaded on timeout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest

from pytest_elastic._settings import RECORD_KEY, STACKS_CLEANUP_KEY, TIMEOUT_STACKS_KEY

if TYPE_CHECKING:
    from pytest_elastic._settings import Settings

__all__ = ["STACKS_ENV", "start_stack_dumps", "add_timeout_markers", "set_timer", "worker_stacks", "rearmed",
           "SECTION"]

#: the directory workers write their faulthandler dumps to (harness.procs._stackdump)
STACKS_ENV = "HARNESS_STACK_DUMP_DIR"
SCENARIO_GRACE_S = 30.0
DUMP_WAIT_S = 3.0
SECTION = "elastic timeout: stacks of the live workers"


def timeout_plugin(config: pytest.Config) -> Any:
    """pytest-timeout's module when it is active in this run, else None."""
    return config.pluginmanager.getplugin("timeout")


def start_stack_dumps(config: pytest.Config) -> None:
    """With pytest-timeout active, the workers of this session can dump their Python stacks
    on SIGUSR1 into a private directory (``STACKS_ENV``, inherited by every agent and
    worker); removed, and the variable restored, at unconfigure."""
    import shutil
    import tempfile

    if os.environ.get(STACKS_ENV):
        return  # an outer session's (pytester in-process): share it
    directory = tempfile.mkdtemp(prefix="pytest-elastic-stacks-")
    os.environ[STACKS_ENV] = directory

    def stop() -> None:
        if os.environ.get(STACKS_ENV) == directory:
            del os.environ[STACKS_ENV]
        shutil.rmtree(directory, ignore_errors=True)

    config.add_cleanup(stop)
    config.stash[STACKS_CLEANUP_KEY] = stop


# -- collection: a timeout for every elastic test ----------------------------------------


def _elastic_timeout(item: pytest.Item, settings: Settings, global_timeout: float | None) -> float | None:
    spec = getattr(item, "spec", None)
    if isinstance(spec, dict) and isinstance(spec.get("job"), dict):  # a scenario item
        job_timeout = spec["job"].get("timeout")
        if job_timeout is not None:
            return float(job_timeout) + SCENARIO_GRACE_S
        if settings.timeout_given or not global_timeout:
            return settings.timeout + SCENARIO_GRACE_S  # its job waits settings.timeout
        return None
    marker = item.get_closest_marker("elastic")
    if marker is not None and "timeout" in marker.kwargs:
        return float(marker.kwargs["timeout"])
    if settings.timeout_given or not global_timeout:
        return settings.timeout
    return None  # pytest-timeout's own --timeout / ini stands


def add_timeout_markers(items: list[pytest.Item], settings: Any, config: pytest.Config) -> None:
    if timeout_plugin(config) is None:
        return
    global_timeout = getattr(config, "_env_timeout", None)
    for item in items:
        if item.get_closest_marker("elastic") is None or item.get_closest_marker("timeout") is not None:
            continue
        seconds = _elastic_timeout(item, settings, global_timeout)
        if seconds is not None:
            item.add_marker(pytest.mark.timeout(seconds))


# -- the timer --------------------------------------------------------------------------


def set_timer(item: pytest.Item, timeout_settings: Any) -> bool | None:
    """``pytest_timeout_set_timer`` for elastic tests: pytest-timeout's own timer, with the
    workers' stacks dumped first. None (pytest-timeout's default) if its API is missing."""
    pt = timeout_plugin(item.config)
    on_signal = getattr(pt, "timeout_sigalrm", None)
    on_thread = getattr(pt, "timeout_timer", None)
    if on_signal is None or on_thread is None:
        return None
    method = timeout_settings.method
    if method == "signal" and threading.current_thread() is not threading.main_thread():
        method = "thread"

    if method == "signal":
        def handler(signum: int, frame: Any) -> None:
            __tracebackhide__ = True
            if not _debugging(pt, timeout_settings):
                item.stash[TIMEOUT_STACKS_KEY] = worker_stacks(_clusters(item))  # for the makereport hook
            on_signal(item, timeout_settings)

        def cancel() -> None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)

        item.cancel_timeout = cancel  # type: ignore[attr-defined]  # pytest-timeout's protocol
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, timeout_settings.timeout)
    else:
        def expire() -> None:
            if not _debugging(pt, timeout_settings):
                clusters = _clusters(item)
                text = worker_stacks(clusters)
                freeze_and_kill(clusters)
                sys.stderr.write(f"\n{'+' * 20} {SECTION} {'+' * 20}\n{text}\n")
                sys.stderr.flush()
                cleanup = item.config.stash.get(STACKS_CLEANUP_KEY, None)
                if cleanup is not None:  # no config cleanup runs after os._exit
                    cleanup()
            on_thread(item, timeout_settings)

        timer = threading.Timer(timeout_settings.timeout, expire)
        timer.name = f"pytest_elastic timeout {item.nodeid}"
        timer.daemon = True

        def cancel() -> None:
            timer.cancel()
            if timer is not threading.current_thread():
                timer.join()

        item.cancel_timeout = cancel  # type: ignore[attr-defined]  # pytest-timeout's protocol
        timer.start()
    return True


def _debugging(pt: Any, timeout_settings: Any) -> bool:
    if getattr(timeout_settings, "disable_debugger_detection", False):
        return False
    is_debugging = getattr(pt, "is_debugging", None)
    return bool(is_debugging and is_debugging())


@contextmanager
def rearmed(item: pytest.Item, limit: float | None = None) -> Iterator[None]:
    """A fresh pytest-timeout timer around one re-run of ``item`` (shrinking), as the
    protocol's own timer covers one run, of at most ``limit`` seconds (what is left of the
    shrink's time); nothing without pytest-timeout."""
    pt = timeout_plugin(item.config)
    get_settings = getattr(pt, "_get_item_settings", None)
    timeout_settings = get_settings(item) if get_settings else None
    armed = bool(timeout_settings and timeout_settings.timeout and timeout_settings.timeout > 0
                 and not timeout_settings.func_only)  # func_only: its call hook arms per run
    if armed and limit is not None and timeout_settings is not None:
        timeout_settings = timeout_settings._replace(timeout=max(1.0, min(timeout_settings.timeout, limit)))
    hook = item.config.hook
    if armed:
        hook.pytest_timeout_cancel_timer(item=item)  # the first run's, if still set
        hook.pytest_timeout_set_timer(item=item, settings=timeout_settings)
    try:
        yield
    finally:
        if armed:
            hook.pytest_timeout_cancel_timer(item=item)


# -- what a timed-out test leaves: stacks, then no processes -----------------------------


def _clusters(item: pytest.Item) -> list[Any]:
    record = item.stash.get(RECORD_KEY, None)
    return [record.cluster] if record is not None else []


def _workers(cluster: Any) -> Iterator[tuple[str, int]]:
    """(label, pid) of every live worker here of every job of ``cluster``."""
    from harness.sim.truth.stacks import job_workers

    for j, job in enumerate(list(cluster.jobs)):
        yield from job_workers(job, f"job {j} ({job.run_id}) ")


def _host_stacks(cluster: Any, wait: float) -> Iterator[str]:
    """The stacks of every live worker on a host of every job of ``cluster``, read there."""
    from harness.sim.truth.stacks import host_stacks

    for j, job in enumerate(list(cluster.jobs)):
        yield from host_stacks(job, f"job {j} ({job.run_id}) ", wait=wait)


def worker_stacks(clusters: list[Any], wait: float = DUMP_WAIT_S,
                  stacks_dir: str | None = None) -> str:
    """Ask every live worker for its Python stacks; the collected text, worker by worker
    (``harness.sim.truth.stacks``, which ``Job.wait`` uses to name a hang too)."""
    from harness.sim.truth import stacks

    stacks_dir = stacks_dir if stacks_dir is not None else os.environ.get(STACKS_ENV)
    workers: list[tuple[str, int]] = []
    notes: list[str] = []
    hosts: list[str] = []
    for cluster in clusters:
        try:
            workers += list(_workers(cluster))
            hosts += _host_stacks(cluster, wait)
        except Exception as e:  # a half-built cluster must not hide the timeout itself
            notes.append(f"(could not list the workers of {cluster!r}: {e})")
    text = stacks.joined([stacks.worker_stacks(workers, stacks_dir, wait), *hosts])
    if notes:
        return "\n".join(notes) if text == stacks.NO_WORKERS else "\n".join([*notes, text])
    return text


def freeze_and_kill(clusters: list[Any]) -> None:
    """Before ``os._exit``: stop every agent (their PDEATHSIG ends them at exit), kill every
    worker's process group now, remove the clusters' temp dirs. Never ``Cluster.close()``
    here: reaping the agents would let the hung test run on under our feet."""
    import shutil

    for cluster in clusters:
        for job in list(cluster.jobs):
            try:
                for node in list(job.nodes.values()):
                    if node.alive():
                        os.kill(node.pid, signal.SIGSTOP)
                for index in list(job.nodes):
                    for pid in job.worker_pids(index).values():
                        try:
                            os.killpg(pid, signal.SIGKILL)
                        except (ProcessLookupError, PermissionError):
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(pid, signal.SIGKILL)
            except Exception as e:  # best effort: pytest-timeout os._exit's right after
                sys.stderr.write(f"pytest-elastic: stopping job {job.run_id} on timeout: {e}\n")
        from harness.sim.storage.mount import sweep

        sweep(under=cluster.directory)  # detach the jobs' filesystems, or their mount points stay
        shutil.rmtree(cluster.directory, ignore_errors=True)
