"""Where nodes run: the same 2-node job on this machine, on two SSH hosts and in a Slurm
allocation, side by side.

    python bench/places.py [--runs 5] [--no-hosts] [--no-slurm]

The job is ``bench/resume.py``'s node-loss run (``resume.fault_run``:
``scenarios/training/train.py``, DDP on gloo with DCP checkpoints, ``NodeKill(node=1)`` at
rank 0's step 6) on ``Cluster(nnodes="1:2", nproc_per_node=2, max_restarts=3)`` at its other
defaults, run once per place per round, the places' order rotating from round to round so
each sees the same load:

  here    no place keyword: the nodes on this machine (in network namespaces where it has them);
  hosts   ``hosts=`` two ``SshdLab`` hosts (``tests/hosts/sshd.py``: real sshd servers, one per
          network namespace), node i on host i;
  slurm   ``slurm=`` the Slurm lab (``tests/slurm/lab.py``: ``slurmctld`` and one ``slurmd``
          per network namespace, Debian's Slurm 22.05), our own allocation of 2 nodes made
          with ``salloc --no-shell`` when the cluster's job first needs it, released at close.

Rows (medians over the runs that succeeded):
  launch -> first step   ``cluster.launch()`` to the first step event (``resume._first_step``;
                         a node's events elsewhere are moved onto our clock by its relay).
                         On Slurm it includes the allocation (``salloc``), which a job inside
                         an allocation of the caller's would not pay; the line under the
                         table says how long that took.
  fault -> resume        the kill (on a host: the agent's tree SIGKILLed there by its
                         supervisor; on Slurm: ``scancel --signal=KILL`` of the node's step)
                         to the first step of the re-formed world (``resume_latency``).
The goal: a place takes at most 1.5x here. torchrun has no place to compare with (it starts
one node per machine and leaves getting there to the user), so the comparison is with our
own nodes here. Progress and each run's lost-time breakdown go to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_ratio, fmt_s, isolate_tmpdir, median, print_table, ratio, stdout_to  # noqa: E402
from hosts import describe  # noqa: E402
from resume import fault_run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.sim.places.hosts import nodes as remote  # noqa: E402
from tests.hosts.sshd import SshdLab, checkout_python, sshd_missing  # noqa: E402
from tests.slurm.lab import SlurmLab, slurm_missing  # noqa: E402

#: a place's job takes at most this many times the same job here
GOAL = 1.5


def job_run(place: dict[str, Any], where: Path) -> dict:
    """One run of the node-loss job with ``place`` (the Cluster's place keyword, or none),
    the workers' lines dropped; with how long the cluster took to close (an allocation of
    its own is released then)."""
    from harness import Cluster

    ckpt = tempfile.mkdtemp(prefix="ckpt-", dir=where)
    with stdout_to(os.devnull):
        cluster = Cluster(nnodes="1:2", nproc_per_node=2, max_restarts=3, **place)
        with cluster:
            sample = fault_run(cluster, "node", ckpt_dir=ckpt)
            sample["allocation"] = _allocation_time(cluster)
    return sample


def _allocation_time(cluster: Any) -> float | None:
    """Seconds ``salloc`` took for a Slurm cluster's own allocation (None elsewhere)."""
    allocation = getattr(cluster.place, "allocation", None)
    return None if allocation is None else allocation().granted_in


@contextmanager
def here_place(root: Path) -> Iterator[dict[str, Any]]:
    yield {}


@contextmanager
def hosts_place(root: Path) -> Iterator[dict[str, Any]]:
    """Two sshd hosts; the client's connections made in the lab's namespace."""
    (root / "sshd").mkdir()
    with SshdLab(root / "sshd", 2) as lab:
        lab.start(0)
        lab.start(1, port=2222)
        python = str(checkout_python(root / "host-python"))
        saved, remote.connector = remote.connector, lab.ssh_host
        try:
            yield {"hosts": [lab.spec(0, python=python), lab.spec(1, python=python)]}
        finally:
            remote.connector = saved


@contextmanager
def slurm_place(root: Path) -> Iterator[dict[str, Any]]:
    """The Slurm lab (two nodes), as ``tests/slurm/test_slurm_job.py`` gives it to a Cluster."""
    (root / "slurm").mkdir()
    with SlurmLab(root / "slurm", 2) as lab:
        python = str(checkout_python(root / "node-python"))
        yield {"slurm": {"controller_address": lab.controller_address,
                         "controller_netns": f"/run/netns/{lab.net.store_namespace}",
                         "slurm_conf": str(lab.conf), "client_prefix": lab.command()[:2], "python": python}}


PLACES: dict[str, Callable[[Path], Any]] = {"here": here_place, "hosts": hosts_place, "slurm": slurm_place}


def measure(names: list[str], runs: int) -> dict[str, list[dict]]:
    samples: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="bench-places-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        places = {name: stack.enter_context(PLACES[name](root)) for name in names}
        for i in range(runs):
            order = names[i % len(names):] + names[:i % len(names)]
            for name in order:
                started = time.monotonic()
                sample = job_run(places[name], root)
                samples[name].append(sample)
                print(f"{name} run {i}: {describe(sample)} [{time.monotonic() - started:.1f} s in all]",
                      file=sys.stderr)
    return samples


def report(samples: dict[str, list[dict]], runs: int) -> None:
    names = list(samples)
    failed = ", ".join(f"{name} {sum(not s['ok'] for s in samples[name])}" for name in names)
    print(f"\n2 nodes x 2 workers (nnodes=1:2), kill_node(1) at step 6, median of {runs} runs per place "
          f"(failed: {failed}); load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    headers = ["", *names, *(f"{name} / here" for name in names if name != "here"), "target", "verdict"]
    rows = []
    for title, key in (("launch -> first step", "first_step"), ("fault -> resume (kill_node 1)", "resume")):
        medians = {name: median([s[key] for s in samples[name] if s["ok"]]) for name in names}
        ratios = [ratio(medians[name], medians.get("here")) for name in names if name != "here"]
        known = [r for r in ratios if r is not None]
        verdict = "n/a" if not known else "PASS" if max(known) <= GOAL else "FAIL"
        rows.append([title, *(fmt_s(medians[name]) for name in names), *(fmt_ratio(r) for r in ratios),
                     f"<= {GOAL}x", verdict])
    print_table(headers, rows)
    if "slurm" in samples:
        granted = median([s["allocation"] for s in samples["slurm"] if s.get("allocation") is not None])
        print(f"slurm's launch -> first step includes salloc's grant of its own allocation: median {fmt_s(granted)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of the job per place (5)")
    parser.add_argument("--no-hosts", action="store_true", help="leave out the SSH hosts")
    parser.add_argument("--no-slurm", action="store_true", help="leave out the Slurm allocation")
    args = parser.parse_args(argv)
    names = ["here"]
    for name, skip, missing in (("hosts", args.no_hosts, sshd_missing), ("slurm", args.no_slurm, slurm_missing)):
        why = None if skip else missing()
        if why:
            print(f"bench/places.py: no {name}: {why}", file=sys.stderr)
        elif not skip:
            names.append(name)
    isolate_tmpdir()
    report(measure(names, args.runs), args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
