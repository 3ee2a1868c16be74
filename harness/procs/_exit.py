"""How a Python worker we start ends once its work is done: what interpreter shutdown does
that a worker can observe, then ``os._exit`` -- never ``Py_FinalizeEx``.

Why: a script that ends without ``destroy_process_group`` leaves torch's gloo threads
running, and one may still have to drop the finished all_reduce's work (and its tensors)
after the script returned. Dropping a tensor that has a Python object takes the GIL; a
thread that asks for the GIL once ``Py_FinalizeEx`` has begun is ended with
``pthread_exit``, whose forced unwind through a ``noexcept`` destructor calls
``std::terminate``: SIGABRT ("terminate called without an active exception") after the
script succeeded (a core dump shows exactly that: ``ProcessGroupGloo::runLoop`` ->
``~AsyncWork`` -> ``decref_pyobject`` -> ``take_gil`` -> ``pthread_exit``, while the main
thread is in ``Py_FinalizeEx``). That race is torch's; skipping the phase it needs closes
it. Used by the zygote's workers and by callables (``--run-path``) under every start method
(``fork`` and ``forkserver`` children end with ``os._exit`` in multiprocessing anyway).
A plain script (``python script.py``) finalizes as Python does, under either launcher.

Kept: non-daemon threads joined, atexit handlers (``multiprocessing``'s among them), stdio
flushed. Skipped: module teardown (torch's takes ~0.4 s) and with it ``__del__`` of what is
still referenced, or only in cycles, at exit.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

__all__ = ["exit_like_python"]


def exit_like_python(code: int) -> NoReturn:
    """End this process with ``code`` after what shutdown does observably."""
    try:
        import threading

        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException:
        pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(code)
