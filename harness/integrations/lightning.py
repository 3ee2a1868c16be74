"""``ElasticCallback``: a Lightning ``Trainer`` judged by the harness with one line,
``L.Trainer(..., callbacks=[ElasticCallback()])``.

Under the harness (a no-op elsewhere) it reports each optimizer step (``trainer.global_step``,
once per step whatever ``accumulate_grad_batches`` is) with its loss and the state the
fault-free twin compares (``harness.report_step``): the module's state dict, every
optimizer's and learning-rate scheduler's, and the RNG states, digested only when the
harness asks. The loss is the step's training loss averaged over the ranks (the strategy's
own ``reduce``): a world that changes size computes the same mean when it computes the same
step, where one rank's loss would be a different batch's. Each checkpoint write
(``trainer.save_checkpoint``, which ``ModelCheckpoint`` calls) is timed as checkpoint badput
in the job's goodput (``harness.report_checkpoint``): Lightning calls its callbacks'
``on_save_checkpoint`` before the file is written and nothing after, so the callback times
the trainer's own ``save_checkpoint`` instead.

It is written for the ``lightning`` package (``import lightning as L``); the older
``pytorch_lightning`` package's ``Trainer`` checks for its own ``Callback`` class.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import lightning.pytorch as pl

import harness
from harness.events import EVENTS_ENV
from harness.integrations.state import rng_states

__all__ = ["ElasticCallback"]


class ElasticCallback(pl.Callback):
    """Reports a Lightning ``Trainer``'s steps, losses, state and checkpoint writes (module doc)."""

    def __init__(self) -> None:
        self.active = bool(os.environ.get(EVENTS_ENV))  # set in every worker the harness runs
        self.reported_step = -1  # the last optimizer step reported: a step accumulates batches

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.active and not getattr(trainer.save_checkpoint, "_timed_by_harness", False):
            trainer.save_checkpoint = _timed(trainer, trainer.save_checkpoint)  # type: ignore[method-assign]

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if not self.active or step == self.reported_step:
            return
        self.reported_step = step
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:  # a step that returned None was skipped by the module
            loss = trainer.strategy.reduce(loss.detach(), reduce_op="mean")

        def trained() -> dict[str, Any]:  # gathered only when the twin asks (a digest reads every byte)
            return {"model": pl_module.state_dict(),
                    "optimizers": [optimizer.state_dict() for optimizer in trainer.optimizers],
                    "schedulers": [config.scheduler.state_dict() for config in trainer.lr_scheduler_configs],
                    "rng": rng_states()}

        harness.report_step(step, loss=loss, state=trained)


def _timed(trainer: pl.Trainer, save: Any) -> Any:
    """``trainer.save_checkpoint``, its write reported as checkpoint badput at the step it saves."""
    @functools.wraps(save)
    def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
        with harness.report_checkpoint(trainer.global_step):
            return save(*args, **kwargs)

    save_checkpoint._timed_by_harness = True  # type: ignore[attr-defined]
    return save_checkpoint
