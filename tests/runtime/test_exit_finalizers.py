"""A worker's end (``harness.procs._exit``) runs the ``weakref.finalize`` callbacks marked to
run at exit, the user's among them, but not torch's deregistration of its operator
libraries: its only effect is on the dispatcher of the process that is ending, and in a
worker forked from the zygote it costs 20 ms an exit."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import sys, weakref
import torch, torch.library
from harness.procs._exit import drop_torch_library_finalizers, exit_like_python

marker = sys.argv[1]

class Box:
    pass

box = Box()
weakref.finalize(box, lambda: open(marker, "w").write("ran"))  # the user's: kept
mine = torch.library.Library("pe_exit_test", "DEF")  # the user's own operator library
mine.define("noop(Tensor x) -> Tensor")

def torch_finalizers(at_exit):
    return sum(1 for f, info in weakref.finalize._registry.items()
               if info.func is torch.library._del_library and f.atexit is at_exit)

before = torch_finalizers(True)
dropped = drop_torch_library_finalizers()
assert before > 1 and dropped == before, (before, dropped)
assert torch_finalizers(True) == 0 and torch_finalizers(False) == before
print("dropped", dropped, flush=True)
exit_like_python(3)
"""


def test_the_users_finalizers_run_at_exit_and_torchs_library_deregistration_does_not(tmp_path):
    marker = tmp_path / "ran"
    done = subprocess.run([sys.executable, "-c", CHILD, str(marker)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("dropped "), done.stdout + done.stderr
    assert marker.read_text() == "ran"


def test_without_torch_there_is_nothing_to_drop():
    code = ("import sys; from harness.procs._exit import drop_torch_library_finalizers; "
            "assert 'torch' not in sys.modules; print(drop_torch_library_finalizers())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "0", done.stderr
