"""Multi-agent cases of PyTorch's ``LocalElasticAgentTest``, run against our runtime.

Derived from PyTorch's test/distributed/elastic/agent/server/test/local_elastic_agent_test.py
(Copyright (c) Facebook, Inc. and its affiliates; BSD-3-Clause, the license this project
also uses). Written anew here rather than copied (see README.md in this folder): the
same jobs (roles, local world sizes, entrypoints, backends, exit-barrier timeouts) and the
same assertions, on ``harness`` imports. What differs from upstream: agents run in forked
processes with a bounded join (upstream joins forever), each node's results come back on
a queue as upstream's do, log dirs live in pytest's ``tmp_path``, and the rendezvous gets
``heartbeat_timeout=5``: these cases are about ranks and barriers, not liveness, and with
our 0.8 s default an agent starved of the CPU for 0.7 s (seven agents and 25 spawned
workers on two busy cores, once in five full runs) fenced itself mid-job. Torch's
rendezvous has no fence at all (torch 2.13's ``dynamic_rendezvous.py``: a failed keep-alive
is only logged) and its peers' bound is 15 s (5 s x 3 attempts). And workers are forked
from their agent (``start_method="fork"``, which torch's agent offers too) instead of
spawned: these jobs are about ranks, roles and barriers, and 25 spawned workers each
importing the test module cost 31 s of CPU per run of this file, 11 s forked (the
spawn path is run by ``test_local_elastic_agent_single.py`` and ``tests/runtime``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import uuid
from dataclasses import dataclass

import pytest

from harness.agent import LocalElasticAgent, RunResult, WorkerSpec
from harness.procs import LogsSpecs
from harness.rendezvous import RendezvousParameters, get_rendezvous_handler

pytestmark = pytest.mark.timeout(240)

#: the rendezvous's liveness bound here (see the module text): generous, as torch's is
LIVENESS_BOUND_S = 5.0


@dataclass
class RankInfo:
    rank: int
    role_rank: int
    group_rank: int
    role_world_size: int
    world_size: int


def _get_role_info() -> RankInfo:
    env = os.environ
    return RankInfo(int(env["RANK"]), int(env["ROLE_RANK"]), int(env["GROUP_RANK"]),
                    int(env["ROLE_WORLD_SIZE"]), int(env["WORLD_SIZE"]))


def _sleep(seconds: float) -> int:
    time.sleep(seconds)
    return int(os.environ["RANK"])


@dataclass
class Conf:
    entrypoint: object
    local_world_size: int
    args: tuple = ()
    role: str = "default"


def _run_agent(conf: Conf, results: mp.Queue, endpoint: str, backend: str, run_id: str,
               nnodes: int, is_host: bool, exit_barrier_timeout: float, log_dir: str) -> None:
    params = RendezvousParameters(backend=backend, endpoint=endpoint, run_id=run_id,
                                  min_nodes=nnodes, max_nodes=nnodes, is_host=is_host,
                                  heartbeat_timeout=LIVENESS_BOUND_S)
    spec = WorkerSpec(role=conf.role, local_world_size=conf.local_world_size,
                      entrypoint=conf.entrypoint, args=conf.args,
                      rdzv_handler=get_rendezvous_handler(params), max_restarts=0,
                      monitor_interval=0.01)
    agent = LocalElasticAgent(spec, start_method="fork", exit_barrier_timeout=exit_barrier_timeout,
                              logs_specs=LogsSpecs(log_dir=log_dir))
    result = agent.run()
    spec.rdzv_handler.shutdown()
    results.put((conf.role, result))  # flushed when the process ends normally


def run_job(confs: list[Conf], endpoint: str, backend: str, tmp_path,
            exit_barrier_timeout: float = 5) -> dict[str, list[RunResult]]:
    """One agent per conf, each in its own (forked) process, as upstream's ``run_job``."""
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    run_id = uuid.uuid4().hex[:8]
    procs = []
    for i in reversed(range(len(confs))):
        p = ctx.Process(target=_run_agent, args=(
            confs[i], results, endpoint, backend, run_id, len(confs), i == 0,
            exit_barrier_timeout, str(tmp_path / f"logs{i}")))
        p.start()
        procs.append(p)
    out: dict[str, list[RunResult]] = {}
    try:
        for _ in confs:  # read before joining: a child blocks until its result is read
            role, result = results.get(timeout=60)
            out.setdefault(role, []).append(result)
    except Exception:
        pass  # an agent died without a result: the assertions below say which role
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join()
    return out


def assert_rank_consistency(results: dict[str, list[RunResult]], expected: dict[str, int]) -> None:
    world = sum(expected.values())
    global_ranks, role_ranks, grouped = [], {}, {}
    for role, runs in results.items():
        for run in runs:
            for info in run.return_values.values():
                assert info.world_size == world
                assert info.role_world_size == expected[role]
                grouped.setdefault(info.group_rank, []).append((info.rank, info.role_rank))
                role_ranks.setdefault(role, []).append(info.role_rank)
                global_ranks.append(info.rank)
    assert sorted(global_ranks) == list(range(world))
    for role, size in expected.items():
        assert sorted(role_ranks[role]) == list(range(size))
    for pairs in grouped.values():  # each agent's workers get consecutive ranks
        for idx in (0, 1):
            ranks = sorted(p[idx] for p in pairs)
            assert ranks == list(range(ranks[0], ranks[-1] + 1))


BACKENDS = ["etcd", "etcd-v2"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_correct_rank_assignment_homogeneous(etcd_endpoint, backend, tmp_path):
    confs = [Conf(_get_role_info, 1, role="master")] + \
        [Conf(_get_role_info, 4, role="trainer") for _ in range(4)] + \
        [Conf(_get_role_info, 3, role="ps") for _ in range(2)]
    results = run_job(confs, etcd_endpoint, backend, tmp_path)
    assert {role: len(runs) for role, runs in results.items()} == {"master": 1, "trainer": 4, "ps": 2}
    assert_rank_consistency(results, {"master": 1, "trainer": 16, "ps": 6})


@pytest.mark.parametrize("backend", BACKENDS)
def test_correct_rank_assignment_heterogeneous(etcd_endpoint, backend, tmp_path):
    confs = [Conf(_get_role_info, 8, role="master")] + \
        [Conf(_get_role_info, n, role="trainer") for n in (1, 2, 3, 4)] + \
        [Conf(_get_role_info, n, role="ps") for n in (5, 2)]
    results = run_job(confs, etcd_endpoint, backend, tmp_path)
    assert {role: len(runs) for role, runs in results.items()} == {"master": 1, "trainer": 4, "ps": 2}
    assert_rank_consistency(results, {"master": 8, "trainer": 10, "ps": 7})


#: etcd-v2's drift is etcd's with another store: slow, the default run is at its 5-minute budget
@pytest.mark.parametrize("backend", ["etcd", pytest.param("etcd-v2", marks=pytest.mark.slow)])
@pytest.mark.parametrize("slow, barrier", [(2, 4), (4, 0)], ids=["drift_success", "drift_fail"])
def test_workers_drift(etcd_endpoint, backend, slow, barrier, tmp_path):
    """Two agents finish ``slow`` seconds apart; an exit barrier shorter than that (0 s in
    upstream's ``workers_drift_fail``) must not fail the job: the slower one ends normally."""
    confs = [Conf(_sleep, 1, args=(0,), role="zzz"), Conf(_sleep, 1, args=(slow,), role="zzz")]
    results = run_job(confs, etcd_endpoint, backend, tmp_path, exit_barrier_timeout=barrier)
    assert len(results.get("zzz", [])) == 2, results
    for run in results["zzz"]:
        assert not run.is_failed(), run
        assert all(rank == out for rank, out in run.return_values.items())
