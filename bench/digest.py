"""What ``report_step(step, loss=..., state=...)`` costs a training step, digests off and on.

The fault-free twin compares final-state digests, so the harness asks for them
(``HARNESS_STATE_DIGEST=1``) and each ``report_step`` with ``state=`` then hashes every byte of
the state. Off, the state is not touched. This bench times, on a 10M-parameter model with
Adam (model + optimizer state: ~30M floats, ~120 MB), one real training step (forward,
backward, optimizer step) and ``report_step`` off and on, so the overhead reads as a fraction
of a step. There is no torchrun counterpart: torchrun has no step reporting; the reference is
the step itself.

    .venv/bin/python bench/digest.py [--params 10e6] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=10e6, help="model parameters (default 10e6)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    import torch

    import harness.sim.truth.progress as progress
    from harness.sim.truth.digest import state_digest

    width = int((args.params / 4) ** 0.5)  # 4 square layers of width^2 weights
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    n_params = sum(p.numel() for p in model.parameters())
    batch = torch.randn(32, width)

    def train_step() -> float:
        opt.zero_grad()
        loss = model(batch).pow(2).mean()
        loss.backward()
        opt.step()
        return loss.item()

    train_step()  # Adam's state exists from here
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    state_bytes = sum(t.numel() * t.element_size() for t in _tensors(state))

    with tempfile.TemporaryDirectory(prefix="bench_digest_") as tmp:
        os.environ.update({"HARNESS_EVENTS": os.path.join(tmp, "events.jsonl"), "HARNESS_NODE": "0", "RANK": "0"})
        rows = {}
        rows["training step"] = _median(train_step, args.reps)
        os.environ.pop(progress.DIGEST_ENV, None)
        rows["report_step, digests off"] = _median(lambda: progress.report_step(1, loss=0.5, state=state), args.reps)
        os.environ[progress.DIGEST_ENV] = "1"
        rows["report_step, digests on"] = _median(lambda: progress.report_step(1, loss=0.5, state=state), args.reps)
        rows["state_digest alone"] = _median(lambda: state_digest(state), args.reps)

    step = rows["training step"]
    print(f"model: {n_params / 1e6:.1f}M parameters; state digested: {state_bytes / 1e6:.0f} MB "
          f"(model + Adam moments); median of {args.reps}")
    print(f"{'':28} {'seconds':>10} {'x step':>8}")
    for name, seconds in rows.items():
        print(f"{name:28} {seconds:10.4f} {seconds / step:8.3f}")
    on = rows["report_step, digests on"]
    print(f"digest throughput: {state_bytes / on / 1e9:.2f} GB/s")
    return 0


def _tensors(value):  # type: ignore[no-untyped-def]
    if isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif hasattr(value, "element_size"):
        yield value


def _median(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


if __name__ == "__main__":
    sys.exit(main())
