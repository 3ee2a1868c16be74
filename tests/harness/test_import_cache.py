"""What a zygote's workers imported is kept across processes (``harness.procs._import_cache``):
a bare ``Cluster()`` in a later process gets a zygote that has it imported before its first
worker starts. Every cache here lives in ``tmp_path`` (``HARNESS_IMPORT_CACHE``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.procs._import_cache import IMPORT_CACHE_ENV

ROOT = Path(__file__).resolve().parents[2]

#: the worker: was the module there when it started (forked from the zygote with it)?
PROBE = """
import sys
with open(sys.argv[1], "a") as fp:
    fp.write(f"{'xml.dom.minidom' in sys.modules}\\n")
import xml.dom.minidom  # stdlib, imported by neither torch nor the runtime: learned from here
"""
#: one process, one bare Cluster() (a private pool, closed with it), one job
DRIVER = """
import sys
from harness import Cluster, WorkerState
with Cluster(nnodes=1, nproc_per_node=1) as cluster:
    result = cluster.launch(sys.argv[1], sys.argv[2]).wait(timeout=120)
assert result.state == WorkerState.SUCCEEDED, result
"""


def _process_runs_a_job(script: Path, out: Path, cache: str) -> str:
    """A fresh process runs one job on a bare ``Cluster()``; what its worker saw at start."""
    env = {**os.environ, IMPORT_CACHE_ENV: cache}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(script), str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[zygote]" not in done.stderr, done.stderr[-3000:]  # no complaint about the cache
    return out.read_text().splitlines()[-1]


def test_a_later_process_zygote_has_what_the_first_one_learned_before_its_first_worker(tmp_path):
    """The probe imports its module only as it ends (no ``report_step``): the zygote must
    read that last ``learn`` before it reports the exit that lets the job close it."""
    script, out = tmp_path / "probe.py", tmp_path / "seen.txt"
    script.write_text(PROBE)
    cache = str(tmp_path / "cache")
    assert _process_runs_a_job(script, out, cache) == "False"  # nothing learned yet
    assert _process_runs_a_job(script, out, cache) == "True"  # a fresh zygote, warm from its start
    assert _process_runs_a_job(script, out, "0") == "False"  # HARNESS_IMPORT_CACHE=0: not used
    (kept,) = Path(cache).glob("imports-*/*.json")
    assert "xml.dom.minidom" in kept.read_text()


BEFORE_FORK = """
import sys, threading
from harness.procs._import_cache import ImportCache, Interpreter
from harness.procs._preload import Preloader, preloadable

def cache():  # each call: another process's view of the same directory
    return ImportCache(sys.argv[1], Interpreter.current(), preloadable)

assert not {"colorsys", "wave", "plistlib"} & set(sys.modules)
cache().remember("script:a", ["colorsys", "xml.no_such_module", "wave"])
cache().remember("script:b", ["plistlib"])
preloader = Preloader(cache())  # a fresh zygote
preloader.before_fork("script:a", workers_alive=True)
assert "colorsys" not in sys.modules, "nothing is imported while a worker of the zygote lives"
preloader.before_fork("script:a", workers_alive=False)
assert {"colorsys", "wave"} <= set(sys.modules), "the target's names, before its first fork"
assert "plistlib" not in sys.modules, "only the target's own names"
assert cache().avoided() == {"xml.no_such_module"}, "what failed is not tried again, here or later"
stray = threading.Event()
threading.Thread(target=stray.wait, daemon=True).start()  # as if importing plistlib had started it
preloader.before_fork("script:b", workers_alive=False)
assert not preloader.learning, "a module that left a thread stops the preloading"
assert cache().avoided() == {"xml.no_such_module", "plistlib"}, "and no later zygote imports it"
assert Preloader(cache()).targets == {} and Preloader(cache()).avoid == cache().avoided()
stray.set()
print("OK")
"""


def test_before_a_fork_the_zygote_imports_the_targets_names_unless_a_worker_is_alive(tmp_path):
    """In a fresh interpreter: the test process has imported more than a zygote has."""
    done = subprocess.run([sys.executable, "-c", BEFORE_FORK, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2, lines  # one per event, each saying which module
    assert "not preloading xml.no_such_module" in lines[0] and "(plistlib) started a thread" in lines[1]


#: the worker: was the package its job allows there when it started (forked with it)?
FRAMEWORK_PROBE = """
import sys
with open(sys.argv[1], "a") as fp:
    fp.write(f"{'extrapkg.model' in sys.modules}\\n")
import extrapkg.model  # a third-party package: preloaded only for a job that names it
"""
ALLOWING_DRIVER = """
import sys
from harness import Cluster, WorkerState
env = {"HARNESS_PRELOAD": sys.argv[3]} if sys.argv[3] else None
with Cluster(nnodes=1, nproc_per_node=1, env=env) as cluster:
    result = cluster.launch(sys.argv[1], sys.argv[2]).wait(timeout=120)
assert result.state == WorkerState.SUCCEEDED, result
"""


def test_a_package_the_jobs_workers_name_is_preloaded_for_them_and_only_while_they_name_it(tmp_path):
    """A framework (transformers, lightning: ~2 s to import) is paid once per zygote, not by
    every restarted worker, when the job's workers name it in ``HARNESS_PRELOAD``."""
    package = tmp_path / "site" / "extrapkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text("WEIGHTS = [1, 2, 3]\n")
    script, out = tmp_path / "probe.py", tmp_path / "seen.txt"
    script.write_text(FRAMEWORK_PROBE)
    env = {**os.environ, IMPORT_CACHE_ENV: str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path / "site")}

    def run(allowed: str) -> str:
        done = subprocess.run([sys.executable, "-c", ALLOWING_DRIVER, str(script), str(out), allowed], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "[zygote]" not in done.stderr, done.stderr[-3000:]
        return out.read_text().splitlines()[-1]

    assert run("") == "False"
    assert run("extrapkg") == "False"  # not learned from the worker that did not name it; learned from this one
    assert run("extrapkg") == "True"  # a fresh zygote imports it before the first fork
    assert run("") == "False"  # no longer named: the cache still knows it, the zygote does not import it
