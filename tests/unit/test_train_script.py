"""The bundled trainer's watchdog bound (``scenarios/scripts/train.py``): it holds on a
loaded runner (a 1 s step timer reaped a worker whose first barrier waited for a slow peer's
imports, an extra restart and a red run) and still catches a hung step."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TRAIN = Path(__file__).resolve().parents[2] / "scenarios" / "scripts" / "train.py"


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("bundled_train", TRAIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_timer_without_a_timeout_and_the_warm_up_bound_in_the_start_up_steps(train):
    """The start-up steps are guarded too (a worker hung there is reaped), by a bound a
    slow start on a loaded runner never reaches, and below the harness's stall bound."""
    from harness.sim.truth.hangs import STALL_WATCHDOG_FLOOR_S

    assert train.step_bound(0.0, 10, 0.5) == 0.0
    assert [train.step_bound(1.0, i, 0.0) for i in range(train.WARMUP_STEPS)] == [train.WARMUP_BOUND] * 2
    assert train.WARMUP_BOUND < STALL_WATCHDOG_FLOOR_S


def test_the_bound_is_the_timeout_or_a_multiple_of_the_slowest_step(train):
    first = train.WARMUP_STEPS
    assert train.step_bound(1.0, first, 0.0) == 1.0  # quiet: the scenario's bound
    assert train.step_bound(1.0, first + 5, 0.05) == 1.0
    assert train.step_bound(1.0, first + 5, 0.4) == pytest.approx(train.LOAD_FACTOR * 0.4)  # busy
