"""A Lightning ``Trainer.fit``, judged by the harness with one line (``ElasticCallback``).

A small MLP learns a synthetic regression on CPU with gloo (``strategy="ddp"``), saving a
checkpoint every ``--save-steps`` optimizer steps into ``--ckpt-dir`` (``ModelCheckpoint``,
``save_last="link"``) and resuming from the last one there (``ckpt_path="last"``) when a
restart or a new world finds one. ``--resumable`` trains from a data loader that says where
in its epoch it is (``state_dict``/``load_state_dict``), which Lightning saves with the
checkpoint and gives back on resume; without it Lightning starts the interrupted epoch's
data over. Run it under torchrun, ``elastic-run`` or the harness.

    python lightning_fit.py --steps 30 --save-steps 5 --ckpt-dir /tmp/ckpt
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch

from harness.integrations.lightning import ElasticCallback

FEATURES = 16


class Regression(L.LightningModule):
    """Two layers with dropout, AdamW and a linearly decaying learning rate."""

    def __init__(self, steps: int, dropout: float):
        super().__init__()
        self.steps = steps
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Dropout(dropout),
                                       torch.nn.Linear(64, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.net(inputs), targets)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / self.steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class Pace(L.Callback):
    """Each optimizer step takes at least ``seconds`` (a node that joins mid-run must find the
    run still going: unpaced, this model's steps take milliseconds)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_train_batch_end(self, *args: Any) -> None:
        time.sleep(self.seconds)


class Samples(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """``size`` random (input, target) pairs, the same on every rank and every run (seeded)."""

    def __init__(self, size: int):
        generator = torch.Generator().manual_seed(1234)
        self.inputs = torch.randn(size, FEATURES, generator=generator)
        self.targets = self.inputs.sum(dim=1, keepdim=True).sin()

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[i], self.targets[i]


class ResumableLoader(torch.utils.data.DataLoader):  # type: ignore[type-arg]
    """A ``DataLoader`` that knows how many batches of its epoch it has handed out, so a
    resume can skip them: Lightning saves ``state_dict()`` in the checkpoint and hands it to
    ``load_state_dict`` on resume (a loader without the pair starts its epoch over)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handed_out = 0
        self.skip = 0

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip, self.handed_out = self.skip, 0, 0
        for index, batch in enumerate(super().__iter__()):
            if index >= skip:
                self.handed_out = index + 1
                yield batch

    def state_dict(self) -> dict[str, int]:
        return {"handed_out": self.handed_out}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skip = state["handed_out"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-steps", type=int, default=5)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--global-batch", type=int, default=8,
                        help="samples per optimizer step whatever the world size (each rank gets global / world)")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds each step takes at least")
    parser.add_argument("--resumable", action="store_true", help="a data loader that resumes mid-epoch")
    opts = parser.parse_args()
    world, local_world = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    L.seed_everything(0, verbose=False)
    model = Regression(opts.steps, opts.dropout)
    if opts.resumable:  # Lightning leaves its sampler alone (use_distributed_sampler=False): deal it here
        samples = Samples(512)
        rank = int(os.environ.get("RANK", "0"))
        sampler = torch.utils.data.DistributedSampler(samples, num_replicas=world, rank=rank, shuffle=True, seed=7)
        data = ResumableLoader(samples, batch_size=opts.global_batch // world, sampler=sampler)
    else:
        data = torch.utils.data.DataLoader(Samples(512), batch_size=opts.global_batch // world, shuffle=True,
                                           generator=torch.Generator().manual_seed(7))
    saves = L.pytorch.callbacks.ModelCheckpoint(dirpath=opts.ckpt_dir, filename="{step}", save_top_k=-1,
                                                every_n_train_steps=opts.save_steps, save_last="link")
    trainer = L.Trainer(accelerator="cpu", devices=local_world, num_nodes=world // local_world,
                        strategy="ddp" if world > 1 else "auto", max_steps=opts.steps,
                        callbacks=[saves, ElasticCallback(), Pace(opts.step_time)], logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        use_distributed_sampler=not opts.resumable)
    trainer.fit(model, data, ckpt_path="last")


if __name__ == "__main__":
    main()
