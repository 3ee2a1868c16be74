"""A Hugging Face ``Trainer`` run, judged by the harness with one line (``ElasticCallback``).

A 2-layer GPT-2 made from a config (random weights, nothing downloaded) learns a synthetic
language model task on CPU with gloo, saving a checkpoint every ``--save-steps`` into
``--ckpt-dir``, and resuming from the newest one there (``resume_from_checkpoint``) when a
restart or a new world finds one. Run it under torchrun, ``elastic-run`` or the harness.

    python hf_trainer.py --steps 30 --save-steps 5 --ckpt-dir /tmp/ckpt
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from harness.integrations.transformers import ElasticCallback

VOCAB, LENGTH = 128, 16


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """``size`` random token sequences, the same on every rank and every run (seeded)."""

    def __init__(self, size: int):
        generator = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(0, VOCAB, (size, LENGTH), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Pace(TrainerCallback):
    """Each optimizer step takes at least ``seconds`` (a node that joins mid-run must find the
    run still going: unpaced, this model's steps take milliseconds)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(self.seconds)


def last_complete_checkpoint(directory: str) -> str | None:
    """The newest ``checkpoint-N`` of ``directory`` that was saved whole: one with its
    ``trainer_state.json``, which the Trainer writes after the weights, optimizer, scheduler and
    RNG states. ``transformers.trainer_utils.get_last_checkpoint`` takes the newest directory,
    and a membership change that stops the workers mid-save leaves one without it: the resume
    then fails ("Can't find a valid checkpoint")."""
    if not os.path.isdir(directory):
        return None
    saved = [(int(name.split("-")[1]), os.path.join(directory, name)) for name in os.listdir(directory)
             if name.startswith("checkpoint-") and name.split("-")[1].isdigit()
             and os.path.exists(os.path.join(directory, name, "trainer_state.json"))]
    return max(saved)[1] if saved else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-steps", type=int, default=5)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--global-batch", type=int, default=0,
                        help="keep this many samples per optimizer step whatever the world size (each rank "
                             "gets global / world); 0: 4 per rank, so the global batch changes with the world")
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds each step takes at least")
    parser.add_argument("--dropout", type=float, default=0.1, help="GPT-2's dropout (its default 0.1): each "
                        "rank draws its masks from its own generator, so a world-size change changes them")
    opts = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_device = opts.global_batch // world if opts.global_batch else 4
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2,
                                       resid_pdrop=opts.dropout, embd_pdrop=opts.dropout, attn_pdrop=opts.dropout))
    args = TrainingArguments(output_dir=opts.ckpt_dir, max_steps=opts.steps, per_device_train_batch_size=per_device,
                             learning_rate=1e-3, save_strategy="steps", save_steps=opts.save_steps,
                             logging_steps=1, report_to=[], use_cpu=True, ddp_backend="gloo", seed=0,
                             dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(512),
                      callbacks=[ElasticCallback(), Pace(opts.step_time)])
    trainer.train(resume_from_checkpoint=last_complete_checkpoint(opts.ckpt_dir))


if __name__ == "__main__":
    main()
