"""gloo all_reduce, print "Done", exit *without* destroy_process_group (as many scripts end).

Modelled on PyTorch's ``test/distributed/launcher/bin/test_script_init_method.py``
(Copyright (c) Facebook, Inc. and its affiliates; BSD-3-Clause, see PyTorch's LICENSE),
the script torch's own launcher tests run with ``--run-path``: the same flags, the same
one all_reduce of a one-hot tensor, and, as there, everything lives in ``main()``.

Ending without ``destroy_process_group`` leaves gloo's threads running into interpreter
exit, and one may still have to drop the finished all_reduce's work after ``main()``
returned; if ``Py_FinalizeEx`` has begun by then, the rank dies of SIGABRT ("terminate
called without an active exception"; mechanism in ``harness/procs/_exit.py``). That race is
torch's; how a launcher starts and ends its workers decides how often it opens. Measured on
this 2-core machine under load (4 workers, runs/aborted):

- a plain script (``python script.py``, a session of its own per worker under either
  launcher): torchrun 2/12, elastic-run 5/12; with the workers left in the agent's session
  (an experiment, not shipped), 0/12. So yes, torchrun hits it too, in this mode;
- ``--run-path``: torchrun 0/15, its workers share torchrun's session *and* wait for the
  agent to collect every return value before finalizing; either alone kept it at 0 (0/27
  without the wait), both removed gave 8/18. elastic-run gave each worker a session (and so
  a scheduler autogroup) of its own and finalized at once: 14/33. Its callable workers now
  keep the agent's session (0/24 with that alone) and end without ``Py_FinalizeEx``
  (``harness.procs._exit``, as the zygote's always did), which closes the race outright.

``tests/runtime/test_no_destroy_exit.py`` holds elastic-run to that; ``bench/launch.py
--abort-soak N`` counts aborts beside torchrun.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="all_reduce once, exit without destroy")
    parser.add_argument("--init-method", "--init_method", required=True)
    parser.add_argument("--world-size", "--world_size", type=int, default=os.getenv("WORLD_SIZE", -1))
    parser.add_argument("--rank", type=int, default=os.getenv("RANK", -1))
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    dist.init_process_group(backend="gloo", init_method=args.init_method,
                            world_size=args.world_size, rank=args.rank)
    world_size = dist.get_world_size()
    one_hot = F.one_hot(torch.tensor(dist.get_rank()), num_classes=world_size)
    dist.all_reduce(one_hot)  # every rank's one-hot summed: all ones
    derived = torch.sum(one_hot).item()
    if derived != world_size:
        raise RuntimeError(f"Wrong world size derived. Expected: {world_size}, Got: {derived}")
    print("Done")


if __name__ == "__main__":
    main()
