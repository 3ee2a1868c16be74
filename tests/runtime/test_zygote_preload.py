"""The zygote learns what its workers import and preloads it between jobs
(``harness.procs._preload``): a restarted worker, or the next test's, does not import it again."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from harness.procs._preload import Preloader, extra_packages, module_name, preloadable
from harness.procs._zygote_client import ZygoteServerProcess

LEARNER = """
import xml.dom.minidom  # stdlib, not imported by torch or the runtime: the zygote may learn it
import localmod  # the user's own module, next to the script: the zygote must never import it
print("LEARNER ran", flush=True)
"""
PROBE = """
import sys
print("PRELOADED", "xml.dom.minidom" in sys.modules, "localmod" in sys.modules, flush=True)
"""


def _run(script, env, cwd):
    out = subprocess.run([sys.executable, "-m", "harness.run", "--standalone", "--start-method=zygote",
                          str(script)], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_a_shared_zygote_preloads_what_a_finished_worker_imported_and_never_user_code(tmp_path):
    (tmp_path / "localmod.py").write_text("LOADED = True\n")
    (tmp_path / "learner.py").write_text(LEARNER)
    (tmp_path / "probe.py").write_text(PROBE)
    server = ZygoteServerProcess()
    try:
        server.wait_ready()
        env = {**os.environ, "HARNESS_ZYGOTE": server.path, "TMPDIR": str(tmp_path)}
        assert "PRELOADED False False" in _run(tmp_path / "probe.py", env, tmp_path)  # nothing learned yet
        assert "LEARNER ran" in _run(tmp_path / "learner.py", env, tmp_path)
        deadline = time.monotonic() + 60  # the zygote imports once idle, between jobs
        while True:
            out = _run(tmp_path / "probe.py", env, tmp_path)
            if "PRELOADED True" in out or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert "PRELOADED True False" in out, out  # the stdlib module yes, the user's module never
    finally:
        server.close()


def test_only_torch_numpy_and_the_standard_library_may_be_preloaded():
    assert preloadable("torch.distributed.checkpoint") and preloadable("numpy.linalg")
    assert preloadable("xml.dom.minidom") and preloadable("json")
    assert not preloadable("localmod") and not preloadable("transformers.models")
    assert not preloadable("__main__") and not preloadable("antigravity") and not preloadable("harness.run")


def test_a_job_allows_more_packages_for_its_own_workers_by_naming_them():
    allowed = extra_packages("transformers, accelerate lightning")
    assert allowed == {"transformers", "accelerate", "lightning"}
    assert preloadable("transformers.models.gpt2", allowed) and not preloadable("localmod", allowed)
    assert not preloadable("__main__", extra_packages("__main__")), "never, even when named"
    assert extra_packages("a.b ../x 1x  , ,") == set() and extra_packages(None) == set()
    assert extra_packages(["transformers"]) == set(), "not a string: nothing"
    assert len(extra_packages(",".join(f"p{i}" for i in range(100)))) == 32
    assert module_name("transformers.models") and module_name("json")
    assert not module_name("a..b") and not module_name("../x") and not module_name("__main__")


def test_a_targets_allowance_is_its_own_and_a_withdrawn_one_no_longer_preloads():
    preloader = Preloader()
    preloader.allow("script:a", extra_packages("extrapkg"))
    assert preloader.learn(["extrapkg", "extrapkg.sub"], key="script:a") == 2
    assert preloader.learn(["extrapkg.other"], key="script:b") == 0, "another target did not allow it"
    assert preloader.learn(["extrapkg.third"]) == 0, "nor does a worker that knows no target"
    assert preloader._known("script:a") == ["extrapkg", "extrapkg.sub"]
    assert [name for name, _ in preloader.pending] == ["extrapkg", "extrapkg.sub"]  # for between jobs
    preloader.allow("script:a", frozenset())  # its workers no longer name the package
    assert preloader._known("script:a") == []
    assert preloader.pending == [], "not imported between jobs either"
    preloader.allow("script:a", extra_packages("extrapkg"))  # named again: learned again
    assert preloader.learn(["extrapkg"], key="script:a") == 1


def test_the_preloader_ignores_garbage_and_what_is_already_imported():
    preloader = Preloader()
    assert preloader.learn("not a list") == 0
    assert preloader.learn([1, None, {"a": 1}, "json", "localmod"]) == 0  # json is imported already
    [name] = _unimported(1)
    assert preloader.learn([name, name]) == 1
    assert preloader.idle_timeout(workers_alive=True) is None  # never while workers run
    assert preloader.idle_timeout(workers_alive=False) is not None


THREAD_CHECK = """
import sys, threading
from harness.procs._preload import Preloader
first, second, third = "colorsys", "wave", "plistlib"
assert not {first, second, third} & set(sys.modules)
preloader = Preloader()
assert preloader.learn([first]) == 1
preloader.start(workers_alive=False)
preloader.pause()  # joins the import thread: what a fork waits for
assert first in sys.modules and preloader.learning, "imported, still learning"
stray_stop = threading.Event()
threading.Thread(target=stray_stop.wait, daemon=True).start()  # as if an import had started it
assert preloader.learn([second]) == 1
preloader.start(workers_alive=False)
preloader.pause()
assert not preloader.learning and preloader.learn([third]) == 0, "a new thread stops the learning"
stray_stop.set()
print("OK")
"""


def test_the_preloader_imports_on_a_thread_and_stops_learning_when_an_import_left_a_thread_behind():
    """In a fresh interpreter: the test process's own threads (xdist's) come and go."""
    out = subprocess.run([sys.executable, "-c", THREAD_CHECK], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-2000:]


def _unimported(count):
    """Standard-library modules this test process has not imported (pytest's plugins vary)."""
    names = [n for n in ("colorsys", "wave", "plistlib", "mailbox", "curses.ascii", "tomllib", "sndhdr",
                         "xdrlib", "nntplib", "chunk", "imghdr", "mailcap") if n not in sys.modules]
    assert len(names) >= count
    return names[:count]
