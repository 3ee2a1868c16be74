"""The twin's cache key names where the job computes: a twin recorded on the CPU is never
reused for the same job on a GPU (its floating-point results differ), nor one recorded with
another GPU split, backend or hosts. The key is read off a job as ``harness.sim.truth.twin``
reads it (``JudgedJob``): entrypoint, args, nodes, and the cluster's settings and GPUs."""

from __future__ import annotations

from types import SimpleNamespace

from harness.hosts import parse_host
from harness.sim.config import ClusterConfig
from harness.sim.truth.twin import twin_key


def _job(backend: str = "gloo", gpus: tuple[tuple[str, ...], ...] = ((), ()), hosts: tuple = ()) -> SimpleNamespace:
    config = ClusterConfig(nnodes="2", nproc_per_node=1, hosts=hosts or None)
    cluster = SimpleNamespace(config=config, backend=backend, gpus_for=lambda node: gpus[node])
    return SimpleNamespace(entrypoint=__file__, module=False, args=["--steps", "4"], launched_nodes=2,
                           cluster=cluster)


def test_the_key_names_the_backend_the_gpus_and_the_hosts():
    base = twin_key(_job())
    assert twin_key(_job()) == base  # the same job: the same twin
    on_gpus = twin_key(_job(backend="nccl", gpus=(("0",), ("1",))))
    shared = twin_key(_job(gpus=(("0",), ("0",))))
    hosts = (parse_host("ssh://ci@198.18.0.5"), parse_host("ssh://ci@198.18.0.6"))
    on_hosts = twin_key(_job(hosts=hosts))
    assert len({base, on_gpus, shared, on_hosts}) == 4


def test_a_twin_two_judges_need_at_once_runs_once(tmp_path, monkeypatch):
    """Two judges of the same job at once (two xdist workers' scenarios): the second waits on
    the key's lock and reads the first's record; the twin runs once."""
    import threading
    import time

    from harness.sim.truth import twin
    from harness.sim.truth.golden import record_of

    runs: list[float] = []

    def run_twin(job, timeout):
        runs.append(time.monotonic())
        time.sleep(0.3)  # long enough for the other judge to find the twin under way
        return record_of([{"rank": 0, "step": 1, "loss": 0.5, "restart_count": 0}], [2])

    monkeypatch.setattr(twin, "_run_twin", run_twin)
    results: list[tuple[object, bool]] = []
    judges = [threading.Thread(target=lambda: results.append(twin.twin_record(_job(), 10.0, str(tmp_path))))
              for _ in range(2)]
    for judge in judges:
        judge.start()
    for judge in judges:
        judge.join()
    assert len(runs) == 1
    assert sorted(cached for _, cached in results) == [False, True]
    assert results[0][0].to_json() == results[1][0].to_json()
