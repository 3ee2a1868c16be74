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

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-steps", type=int, default=5)
    parser.add_argument("--ckpt-dir", required=True)
    opts = parser.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2))
    args = TrainingArguments(output_dir=opts.ckpt_dir, max_steps=opts.steps, per_device_train_batch_size=4,
                             learning_rate=1e-3, save_strategy="steps", save_steps=opts.save_steps,
                             logging_steps=1, report_to=[], use_cpu=True, ddp_backend="gloo", seed=0,
                             dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(512), callbacks=[ElasticCallback()])
    last = get_last_checkpoint(opts.ckpt_dir) if os.path.isdir(opts.ckpt_dir) else None
    trainer.train(resume_from_checkpoint=last)


if __name__ == "__main__":
    main()
