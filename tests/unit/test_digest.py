"""Training-state digests and what ``report_step`` puts on a step (loss, digest on request).

The digest is the fault-free twin's final-state oracle, so its one job is to differ when one
bit of the state does and to agree when nothing does, whatever the key order or layout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch

from harness.sim.truth.digest import state_digest


def _model_state(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "rng": torch.get_rng_state(), "step": 1}


def test_the_same_state_has_the_same_digest_whatever_the_key_order():
    a, b = _model_state(), _model_state()
    shuffled = {k: b[k] for k in reversed(list(b))}
    assert state_digest(a) == state_digest(shuffled)
    assert len(state_digest(a)) == 64


def test_one_flipped_bit_changes_the_digest():
    state = _model_state()
    before = state_digest(state)
    weight = state["model"]["0.weight"]
    weight.view(torch.int32)[0, 0] ^= 1  # the lowest mantissa bit of one parameter
    assert state_digest(state) != before


def test_optimizer_moments_rng_and_plain_values_count():
    base = state_digest(_model_state())
    other_optim = _model_state()
    next(iter(other_optim["optim"]["state"].values()))["exp_avg"].add_(1e-7)
    assert state_digest(other_optim) != base
    other_rng = _model_state()
    other_rng["rng"] = torch.get_rng_state()  # the RNG moved on since
    torch.rand(1)
    assert state_digest({**other_rng, "rng": torch.get_rng_state()}) != base
    assert state_digest({**_model_state(), "step": 2}) != base


def test_dtype_shape_and_layout():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert state_digest(t) != state_digest(t.to(torch.float64))
    assert state_digest(t) != state_digest(t.reshape(3, 2))
    assert state_digest(t.t().contiguous()) == state_digest(t.t())  # a strided view hashes its values
    assert state_digest(t.to(torch.bfloat16)) != state_digest(t.to(torch.float16))
    assert state_digest(torch.empty(0)) == state_digest(torch.empty(0))


WORKER = textwrap.dedent("""\
    import torch
    from harness import report_step
    w = torch.ones(3)
    report_step(1, loss=torch.tensor(0.1, dtype=torch.float32), state={"w": w})
    report_step(2, loss=0.25)
    """)


def _steps(tmp_path, digest: bool) -> list[dict]:
    events = tmp_path / f"events_{digest}.jsonl"
    env = {**os.environ, "HARNESS_EVENTS": str(events), "HARNESS_NODE": "0", "RANK": "3", "LOCAL_RANK": "1"}
    env.pop("HARNESS_STATE_DIGEST", None)
    if digest:
        env["HARNESS_STATE_DIGEST"] = "1"
    subprocess.run([sys.executable, "-c", WORKER], env=env, check=True, timeout=120)
    return [json.loads(line) for line in events.read_text().splitlines()]


def test_a_step_carries_its_exact_loss_and_a_digest_only_when_asked(tmp_path):
    plain = _steps(tmp_path, digest=False)
    assert [(e["step"], e["rank"], e["loss"]) for e in plain] == [
        (1, 3, float(torch.tensor(0.1, dtype=torch.float32))), (2, 3, 0.25)]
    assert all("digest" not in e for e in plain)
    digested = _steps(tmp_path, digest=True)
    assert digested[0]["digest"] == state_digest({"w": torch.ones(3)})
    assert "digest" not in digested[1]


def test_outside_the_harness_report_step_does_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    out = subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == "", out.stderr  # stderr: torch's own import warnings
    assert list(tmp_path.iterdir()) == []
