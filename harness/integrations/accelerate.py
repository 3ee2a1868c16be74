"""``ElasticAccelerator``: an Accelerate training loop judged by the harness with one line,
``accelerator = ElasticAccelerator(...)`` where the loop made an ``Accelerator``.

An Accelerate loop is the user's own, so there is no callback to add: this ``Accelerator``
reports what the loop already does. ``accelerator.log({"loss": ...}, step=step)`` (a loop's
usual line) reports the step with its loss (``harness.report_step``) and, when the twin asks,
the state it compares: every prepared model's, optimizer's and scheduler's state dict and
the RNG states; ``save_state`` is timed as checkpoint badput (``harness.report_checkpoint``).
Outside the harness it is the plain ``Accelerator``: the line stays when the script trains
for real.
"""

from __future__ import annotations

import os
from typing import Any

from accelerate import Accelerator

import harness
from harness.events import EVENTS_ENV
from harness.integrations.state import rng_states

__all__ = ["ElasticAccelerator"]


class ElasticAccelerator(Accelerator):
    """``Accelerator`` that reports its loop's steps, losses, state and saves (module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.under_harness = bool(os.environ.get(EVENTS_ENV))  # set in every worker the harness runs
        self.last_step = 0  # the step ``log`` last reported: a save's step

    def log(self, values: dict[str, Any], step: int | None = None, log_kwargs: dict[str, Any] | None = None) -> None:
        super().log(values, step=step, log_kwargs=log_kwargs)
        if self.under_harness and step is not None and "loss" in values:
            self.last_step = step
            harness.report_step(step, loss=float(values["loss"]), state=self._trained)

    def save_state(self, output_dir: str | None = None, safe_serialization: bool = True, **kwargs: Any) -> Any:
        if not self.under_harness:
            return super().save_state(output_dir, safe_serialization, **kwargs)
        with harness.report_checkpoint(self.last_step):
            return super().save_state(output_dir, safe_serialization, **kwargs)

    def _trained(self) -> dict[str, Any]:
        """What the twin compares, gathered only when it asks (a digest reads every byte)."""
        return {"models": [self.unwrap_model(model).state_dict() for model in self._models],
                "optimizers": [optimizer.state_dict() for optimizer in self._optimizers],
                "schedulers": [scheduler.state_dict() for scheduler in self._schedulers],
                "rng": rng_states()}
