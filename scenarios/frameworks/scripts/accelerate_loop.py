"""An Accelerate training loop, judged by the harness with one line (``ElasticAccelerator``).

A 2-layer GPT-2 made from a config (random weights, nothing downloaded) learns a synthetic
language-model task on CPU with gloo: ``accelerator.prepare``, ``accelerator.backward``,
``accelerator.log`` every step, ``accelerator.save_state`` every ``--save-steps`` into
``--ckpt-dir``/``step-N`` and, at start, ``load_state`` of the newest whole one there and
``skip_first_batches`` past the steps it holds; ``--step-time`` paces the steps (a node added
mid-run must land while the run still trains). Run it under torchrun, ``elastic-run`` or the
harness.

    python accelerate_loop.py --steps 30 --save-steps 5 --ckpt-dir /tmp/ckpt
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from harness.integrations.accelerate import ElasticAccelerator

VOCAB, LENGTH = 128, 16


def last_whole_save(directory: str) -> tuple[int, str] | None:
    """(step, dir) of the newest ``step-N`` whose ``done.json`` says it was saved whole
    (written after ``save_state`` returned on every rank)."""
    if not os.path.isdir(directory):
        return None
    saved = [(int(name[5:]), os.path.join(directory, name)) for name in os.listdir(directory)
             if name.startswith("step-") and name[5:].isdigit()
             and os.path.exists(os.path.join(directory, name, "done.json"))]
    return max(saved) if saved else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-steps", type=int, default=5)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds each step lasts at least")
    opts = parser.parse_args()
    accelerator = ElasticAccelerator(cpu=True)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / opts.steps)
    ids = torch.randint(0, VOCAB, (512, LENGTH), generator=torch.Generator().manual_seed(1234))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), shuffle=True,
                                       batch_size=opts.global_batch // accelerator.num_processes,
                                       generator=torch.Generator().manual_seed(7))
    model, optimizer, data, scheduler = accelerator.prepare(model, optimizer, data, scheduler)
    start = 0
    found = last_whole_save(opts.ckpt_dir)
    if found is not None:
        start, where = found
        accelerator.load_state(where)
    batches = accelerator.skip_first_batches(data, start) if start else data
    step = start
    for (tokens,) in batches:
        if step >= opts.steps:
            break
        time.sleep(opts.step_time)
        loss = model(input_ids=tokens, labels=tokens).loss
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        step += 1
        accelerator.log({"loss": accelerator.reduce(loss.detach(), "mean").item()}, step=step)
        if step % opts.save_steps == 0:
            where = os.path.join(opts.ckpt_dir, f"step-{step}")
            accelerator.save_state(where)
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                with open(os.path.join(where, "done.json"), "w") as out:
                    json.dump({"step": step}, out)
    # end without torch's teardown deadlock (a worker held in ~ProcessGroupGloo after main
    # returned, pytorch#56297; end_training destroys the group while the DDP model still holds
    # it): let gloo's run loop retire its work, drop the DDP model while the group has another
    # owner, then the group (end_training)
    accelerator.wait_for_everyone()
    time.sleep(0.05)
    del model, optimizer, scheduler, data, batches
    accelerator.free_memory()
    accelerator.end_training()


if __name__ == "__main__":
    main()
