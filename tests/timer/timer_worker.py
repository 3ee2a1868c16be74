"""Worker processes for the timer tests: ``python timer_worker.py MODE FIFO [ARGS]``.

Every mode prints one line when its requests were sent, so a test can order its steps
on what the worker did instead of on sleeps. Not collected by pytest (no ``test_``).
"""

from __future__ import annotations

import os
import sys
import time


def _hang() -> None:
    time.sleep(60)


def main(mode: str, path: str, *args: str) -> None:
    if mode.startswith("torch-"):
        import torch.distributed.elastic.timer as timer  # torch's own client and expires()
    else:
        import harness.timer as timer

    if mode == "torch-serve":  # torch's FileTimerServer (it SIGKILLs itself after a reap)
        server = timer.FileTimerServer(path, "compat", max_interval=0.1)
        server.start()
        print("ready", flush=True)
        _hang()
        return

    timer.configure(timer.FileTimerClient(path))
    if mode in ("hang", "torch-hang"):
        # a scope that is released first (a lost release would expire it first), then a hang
        with timer.expires(after=0.2, scope="released"):
            pass
        with timer.expires(after=float(args[0]), scope="hang"):
            print("acquired", flush=True)
            _hang()
    elif mode == "release":
        with timer.expires(after=float(args[0]), scope="quick"):
            pass
        print("released", flush=True)
        _hang()
    elif mode == "raise":
        try:
            with timer.expires(after=float(args[0]), scope="raises"):
                raise ValueError("boom")
        except ValueError:
            print("released", flush=True)
        _hang()
    elif mode == "nested":
        with timer.expires(after=30, scope="outer"):
            with timer.expires(after=0.2, scope="inner-done"):
                pass
            with timer.expires(after=float(args[0]), scope="inner-hang"):
                print("acquired", flush=True)
                _hang()
    elif mode == "decorated":
        @timer.expires(after=float(args[0]), scope="decorated")
        def step() -> None:
            print("acquired", flush=True)
            _hang()

        step()
    elif mode == "env":
        timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
        with timer.expires(after=float(args[0]), scope="from-env"):
            print("acquired", flush=True)
            _hang()
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
