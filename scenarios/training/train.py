"""A trainer a user would recognise, that resumes *right*: the fault-free twin's test subject.

Model and optimizer are saved and loaded with ``torch.distributed.checkpoint`` (DCP), which
reshards: a checkpoint written by 4 ranks loads on 2. Everything else a resume needs is saved
beside them, in the same DCP checkpoint:

* the RNG: one ``torch.Generator`` draws each epoch's shuffle and every step's input noise;
* the data position: the epoch's permutation and the offset into it;
* the LR scheduler's state and the step.

The global batch is fixed (``--global-batch``) and split evenly by world size; each rank's loss
is the mean over its slice and DDP (or FSDP2) averages the gradients, so a step computes the
gradient of the mean over the whole global batch at any world size: a resume after a
scale-down is the same math, up to the order of floating-point sums. The loss each rank
reports is the global batch's (all-reduced), so it is comparable across world sizes.

``--forget rng|data-position|optimizer|lr-scheduler`` (repeatable) makes the resume forget
that piece of state, as real trainers have (accelerate#2016, transformers#34053,
Megatron-LM#6858): the run still finishes, with a plausible loss, and only the comparison
with the fault-free twin shows it trained a different model.

Checkpoints are ``{ckpt-dir}/step_<N>`` (DCP writes ``.metadata`` last, so a directory with it
is complete) and ``{ckpt-dir}/latest`` names the newest, replaced atomically by rank 0 after
every rank finished the save.

``--save naive|safe`` (DDP only) writes one ``torch.save`` file from rank 0 instead,
``{ckpt-dir}/ckpt.pt``: *naive* straight to the final path with no fsync (what
``torch.save(state, path)`` does), *safe* to a temp file that is fsynced, renamed into place
and its directory fsynced. A node crash that loses unsynced writes
(``kill_node(lose_unsynced=True)``) leaves the naive file empty and the safe one whole
(``scenarios/storage``).

``--device auto|cpu|cuda`` (``auto``: cuda when torch sees a GPU) picks where the model, the
data and the optimizer live: ``cuda:LOCAL_RANK`` (modulo the devices the node sees: the
harness gives each simulated node its own ``CUDA_VISIBLE_DEVICES``, and workers of a node
with fewer devices than workers share them). The dataset, the permutation and every step's
noise are still drawn on the CPU, from the same generator, and only then moved: the same
numbers on either device. ``--backend`` is the process group's: pass the harness's
``{backend}`` (``nccl`` when every worker has a GPU of its own, else ``gloo``, which carries
CUDA tensors too: NCCL refuses two ranks on one device). Without it: ``gloo`` on the CPU,
``nccl`` on cuda when this node has a device per worker, else ``gloo`` (the trainer cannot
see that simulated *nodes* share a device: only ``{backend}`` says so).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

try:  # the harness's step and checkpoint reports; no-ops outside it
    from harness import report_checkpoint, report_step
except ImportError:  # pragma: no cover
    import contextlib

    def report_step(step: int, loss: object = None, state: object = None, **fields: object) -> None:
        pass

    def report_checkpoint(step: int) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

FORGETTABLE = ("rng", "data-position", "optimizer", "lr-scheduler")
SAMPLES, FEATURES = 256, 16


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--ckpt-dir", required=True, help="where checkpoints go (the harness's {shared}/ckpt)")
    p.add_argument("--ckpt-every", type=int, default=5, help="save after every N steps")
    p.add_argument("--global-batch", type=int, default=48, help="samples per step, split by world size")
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    p.add_argument("--forget", action="append", choices=FORGETTABLE, default=[],
                   help="on resume, forget this state (a classic bug, for the oracle to catch)")
    p.add_argument("--save", choices=("dcp", "naive", "safe"), default="dcp",
                   help="checkpoint with DCP, or one torch.save file written naively or safely")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where to train (auto: cuda when torch.cuda.is_available())")
    p.add_argument("--backend", default=None,
                   help="process-group backend (pass the harness's {backend}); default: nccl on cuda "
                        "when the node has a device per worker, else gloo")
    args = p.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    elif args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device")
    if args.backend is None:
        own = args.device == "cuda" and int(os.environ.get("LOCAL_WORLD_SIZE", "1")) <= torch.cuda.device_count()
        args.backend = "nccl" if own else "gloo"
    if args.backend == "nccl" and args.device != "cuda":
        p.error("--backend nccl needs --device cuda (torch sees no CUDA device, or --device cpu was asked)")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.global_batch % world:
        p.error(f"--global-batch={args.global_batch} must divide by WORLD_SIZE={world}")
    if args.save != "dcp" and args.parallel != "ddp":
        p.error(f"--save {args.save} needs --parallel ddp (one rank holds the whole state)")
    return args


def dataset(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed regression problem: the same on every rank and every run."""
    g = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    return x, torch.tanh(x @ w) + 0.05 * torch.randn(SAMPLES, 1, generator=g)


def device_of(args: argparse.Namespace) -> torch.device:
    """``cpu``, or this worker's GPU: ``cuda:LOCAL_RANK`` among the devices its node sees
    (modulo their count: a node's workers share its devices when it has fewer than them)."""
    if args.device != "cuda":
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())


def build(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(args.seed)  # the same initial weights on every rank and every run
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    model.to(device)  # made on the CPU (the same weights on either device), then moved
    if args.parallel == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=init_device_mesh(device.type, (dist.get_world_size(),)))
        return model
    if device.type == "cuda":
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    return torch.nn.parallel.DistributedDataParallel(model)


class Data:
    """The data position and the RNG: an epoch's permutation, the offset into it, and the
    generator that draws permutations and per-step noise."""

    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed(seed)
        self.perm = torch.randperm(SAMPLES, generator=self.gen)
        self.offset = 0

    def next_batch(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.offset + size > SAMPLES:
            self.perm, self.offset = torch.randperm(SAMPLES, generator=self.gen), 0
        idx = self.perm[self.offset:self.offset + size]
        self.offset += size
        return idx, 0.01 * torch.randn(size, FEATURES, generator=self.gen)


def checkpoint_state(model: torch.nn.Module, opt: torch.optim.Optimizer, sched: object, data: Data,
                     step: int) -> dict:
    model_sd, optim_sd = get_state_dict(model, opt)
    return {"model": model_sd, "optim": optim_sd,
            "train": {"step": step, "offset": data.offset, "perm": data.perm.clone(),
                      "rng": data.gen.get_state(), "sched": sched.state_dict()}}  # type: ignore[attr-defined]


def save(args: argparse.Namespace, state: dict, step: int) -> None:
    path = os.path.join(args.ckpt_dir, f"step_{step}")
    dcp.save(state, checkpoint_id=path)
    dist.barrier()  # every rank's shard is written before the pointer moves
    if dist.get_rank() == 0:
        tmp = os.path.join(args.ckpt_dir, "latest.tmp")
        with open(tmp, "w") as fp:
            fp.write(f"step_{step}")
            fp.flush()
            os.fsync(fp.fileno())
        os.replace(tmp, os.path.join(args.ckpt_dir, "latest"))


def save_file(args: argparse.Namespace, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: object,
              data: Data, step: int) -> None:
    """One ``torch.save`` file from rank 0: naively (``torch.save`` to the final path, no
    fsync), or safely (temp file, fsync, rename, directory fsync)."""
    if dist.get_rank() == 0:
        state = {"model": model.module.state_dict(), "optim": opt.state_dict(),  # type: ignore[operator]
                 "train": {"step": step, "offset": data.offset, "perm": data.perm.clone(),
                           "rng": data.gen.get_state(), "sched": sched.state_dict()}}  # type: ignore[attr-defined]
        path = os.path.join(args.ckpt_dir, "ckpt.pt")
        if args.save == "naive":
            torch.save(state, path)  # the page cache has it; the disk may not, ever
        else:
            tmp = path + ".tmp"
            with open(tmp, "wb") as fp:
                torch.save(state, fp)
                fp.flush()
                os.fsync(fp.fileno())  # the bytes are on disk before the name points at them
            os.replace(tmp, path)  # atomic: the old checkpoint or the new one, never half of one
            fd = os.open(args.ckpt_dir, os.O_RDONLY)
            try:
                os.fsync(fd)  # and the rename itself is on disk
            finally:
                os.close(fd)
    dist.barrier()


def resume_file(args: argparse.Namespace, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: object,
                data: Data, device: torch.device) -> tuple[int, str]:
    path = os.path.join(args.ckpt_dir, "ckpt.pt")
    if not os.path.exists(path):
        return 0, ""
    # lost: EOFError (empty), or "failed finding central directory"
    state = torch.load(path, map_location=device, weights_only=False)
    model.module.load_state_dict(state["model"])  # type: ignore[operator]
    opt.load_state_dict(state["optim"])
    train = state["train"]
    data.gen.set_state(train["rng"].cpu())  # the data's RNG and permutation stay on the CPU
    data.perm, data.offset = train["perm"].cpu(), int(train["offset"])
    sched.load_state_dict(train["sched"])  # type: ignore[attr-defined]
    return int(train["step"]), "ckpt.pt"


def resume(args: argparse.Namespace, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: object,
           data: Data, device: torch.device) -> tuple[int, str]:
    """Load the newest complete checkpoint, minus what ``--forget`` says; the step to go on from."""
    if args.save != "dcp":
        return resume_file(args, model, opt, sched, data, device)
    try:
        with open(os.path.join(args.ckpt_dir, "latest")) as fp:
            name = fp.read().strip()
    except FileNotFoundError:
        return 0, ""
    state = checkpoint_state(model, opt, sched, data, 0)
    dcp.load(state, checkpoint_id=os.path.join(args.ckpt_dir, name))
    set_state_dict(model, opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"] if "optimizer" not in args.forget else get_state_dict(model, opt)[1])
    train = state["train"]
    if "rng" not in args.forget:
        data.gen.set_state(train["rng"])
    if "data-position" not in args.forget:
        data.perm, data.offset = train["perm"], int(train["offset"])
    if "lr-scheduler" not in args.forget:
        sched.load_state_dict(train["sched"])  # type: ignore[attr-defined]
    return int(train["step"]), name


def main() -> int:
    args = parse()
    device = device_of(args)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if args.backend == "nccl":
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    os.makedirs(args.ckpt_dir, exist_ok=True)
    x, y = (t.to(device) for t in dataset(args.seed))  # drawn on the CPU, then moved
    model = build(args, device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4) * 0.97 ** s)
    data = Data(args.seed)
    start, resumed_from = resume(args, model, opt, sched, data, device)
    local = args.global_batch // world
    loss_global = torch.zeros((), device=device)
    for step in range(start, args.steps):
        idx, noise = data.next_batch(args.global_batch)  # on the CPU, from the data's generator
        mine = slice(rank * local, (rank + 1) * local)
        idx, noise = idx[mine].to(device), noise[mine].to(device)
        loss = torch.nn.functional.mse_loss(model(x[idx] + noise), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        loss_global = loss.detach().clone()
        dist.all_reduce(loss_global)
        loss_global /= world
        if args.step_time:
            time.sleep(args.step_time)
        done = step + 1
        # the final state is digested (when the harness asks) with the last step's report
        final = dict(zip(("model", "optim"), get_state_dict(model, opt), strict=True)) if done == args.steps else None
        report_step(step, loss=loss_global, state=final)
        if done % args.ckpt_every == 0 or done == args.steps:
            with report_checkpoint(done):  # its time is checkpoint badput in the job's goodput
                if args.save == "dcp":
                    save(args, checkpoint_state(model, opt, sched, data, done), done)
                else:
                    save_file(args, model, opt, sched, data, done)
    if rank == 0:
        print(json.dumps({"steps": args.steps, "resumed_from": resumed_from, "world_size": world,
                          "loss": float(loss_global), "forgot": args.forget, "device": str(device),
                          "backend": args.backend}), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without tearing the process group or the interpreter down. Dropping a gloo
    # process group can deadlock inside torch 2.13: the main thread joins gloo's runLoop
    # thread while holding the GIL that thread needs to free its last finished Work (seen
    # under torchrun too: at interpreter exit with DDP's Reducer holding the group, and in
    # destroy_process_group(); py-spy stacks in the issue-17 note). Every collective is done
    # (save() ends in a barrier), so nothing is lost by not tearing down.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
