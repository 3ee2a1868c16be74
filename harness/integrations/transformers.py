"""``ElasticCallback``: a Hugging Face ``Trainer`` judged by the harness with one line,
``Trainer(..., callbacks=[ElasticCallback()])``.

Under the harness (a no-op elsewhere) it reports each optimizer step with its loss and the
state the fault-free twin compares (``harness.report_step``): the model's, optimizer's and
learning-rate scheduler's state dicts and the RNG states, digested only when the harness
asks. It reports every step (it sets the run's ``logging_steps`` to 1: the step's loss is
what the ``Trainer`` logs, the mean over its ranks), so faults can be keyed on a step and
no step of the run goes unjudged; and it times each checkpoint save (``save_steps``) as
checkpoint badput in the job's goodput (``harness.report_checkpoint``).
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from typing import Any

from transformers import TrainerCallback

import harness
from harness.events import EVENTS_ENV
from harness.integrations.state import rng_states

__all__ = ["ElasticCallback"]


class ElasticCallback(TrainerCallback):
    """Reports a ``Trainer``'s steps, losses, state and checkpoint saves to the harness (module doc)."""

    def __init__(self) -> None:
        self.active = bool(os.environ.get(EVENTS_ENV))  # set in every worker the harness runs
        self._saving: AbstractContextManager[None] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.active:
            state.logging_steps = 1  # the step's loss on every step (the Trainer reads it from its state)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.active and control.should_save:  # the Trainer saves next, then calls on_save
            self._saving = harness.report_checkpoint(state.global_step)
            self._saving.__enter__()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._saving is not None:
            saving, self._saving = self._saving, None
            saving.__exit__(None, None, None)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               model: Any = None, optimizer: Any = None, lr_scheduler: Any = None, **kwargs: Any) -> None:
        if not self.active or not logs or "loss" not in logs:
            return
        def trained() -> dict[str, Any]:  # gathered only when the twin asks (a digest reads every byte)
            return {"model": model.state_dict() if model is not None else None,
                    "optimizer": optimizer.state_dict() if optimizer is not None else None,
                    "scheduler": lr_scheduler.state_dict() if lr_scheduler is not None else None,
                    "rng": rng_states()}

        harness.report_step(state.global_step, loss=float(logs["loss"]), state=trained)
