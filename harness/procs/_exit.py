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

Kept: non-daemon threads joined, atexit handlers (``multiprocessing``'s among them, and
every ``weakref.finalize`` marked to run at exit but torch's operator libraries'), stdio
flushed. Skipped: module teardown (torch's takes ~0.4 s) and with it ``__del__`` of what is
still referenced, or only in cycles, at exit; and torch's deregistration of each operator
library it made (``torch.library.Library``: some 130 at import), a ``weakref.finalize``
each, whose only effect is on the dispatcher tables of the process that is ending. In a
worker forked from the zygote each of its writes copies a page shared with the zygote:
20 ms an exit, on every worker's exit and restart (4.5 ms in a fresh interpreter).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

__all__ = ["drop_torch_library_finalizers", "exit_like_python"]


def drop_torch_library_finalizers() -> int:
    """Tell torch's operator libraries' finalizers (``torch.library._del_library``) not to
    run at exit (see the module docstring); how many there were."""
    library = sys.modules.get("torch.library")
    deregister = getattr(library, "_del_library", None)
    if deregister is None:
        return 0
    import weakref

    dropped = 0
    registry = getattr(weakref.finalize, "_registry", {})  # CPython's: finalizer -> its info
    for finalizer, info in list(registry.items()):
        if getattr(info, "func", None) is deregister:
            finalizer.atexit = False
            dropped += 1
    return dropped


def exit_like_python(code: int) -> NoReturn:
    """End this process with ``code`` after what shutdown does observably."""
    try:
        drop_torch_library_finalizers()
    except BaseException:
        pass
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
