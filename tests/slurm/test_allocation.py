"""``SlurmAllocation`` on the real Slurm lab: one of our own is made with ``salloc
--no-shell`` and released at close; one given (``job_id``) is used and left; its nodes are
named with their addresses, and each is reached as a host with job steps."""

from __future__ import annotations

import sys

import pytest

from harness.hosts import HostError, SlurmAllocation, allocation_refusal, slurm_spec
from harness.hosts._slurm import partition_size
from tests.slurm.lab import SlurmLab


def _spec(lab: SlurmLab, **fields):
    return slurm_spec(controller_address=lab.controller_address, slurm_conf=str(lab.conf),
                      client_prefix=lab.command()[:2], python=sys.executable, **fields)


def _jobs(lab: SlurmLab) -> list[str]:
    return lab.run("squeue", "--noheader", "--format=%i").stdout.split()


def test_our_own_allocation_is_made_and_released(slurm_lab: SlurmLab):
    allocation = SlurmAllocation(_spec(slurm_lab), nodes=2)
    try:
        assert allocation.ours and _jobs(slurm_lab) == [allocation.job_id]
        nodes = allocation.nodes()
        assert len(nodes) == 2
        addresses = {slurm_lab.node_name(i): slurm_lab.net.address(i) for i in range(slurm_lab.nnodes)}
        assert all(addresses[name] == address for name, address in nodes)
        name, address = nodes[1]
        spec = allocation.host_spec(name, address)
        assert spec.label == name
        with allocation.connect(spec) as host:
            assert host.run(["sh", "-c", "echo $SLURMD_NODENAME"]).stdout.strip() == name
    finally:
        assert allocation.close() == []
    assert _jobs(slurm_lab) == []


def test_a_given_allocation_is_used_and_left(slurm_lab: SlurmLab):
    mine = SlurmAllocation(_spec(slurm_lab), nodes=1)
    try:
        given = SlurmAllocation(_spec(slurm_lab, job_id=mine.job_id), nodes=3)
        assert not given.ours and given.job_id == mine.job_id and len(given.nodes()) == 1
        assert given.close() == [] and _jobs(slurm_lab) == [mine.job_id]
    finally:
        mine.close()


def test_an_allocation_that_cannot_be_had_says_why_in_one_line(slurm_lab: SlurmLab):
    with pytest.raises(HostError, match=r"Slurm: salloc of 2 node\(s\) failed \(exit 1\): .*[Ii]nvalid partition"):
        SlurmAllocation(_spec(slurm_lab, partition="nosuch"), nodes=2)
    assert _jobs(slurm_lab) == []


def test_more_nodes_than_the_partition_has_is_refused_at_once_saying_how_to_share_them(slurm_lab: SlurmLab):
    """salloc would queue such a request until its wait ran out; sinfo says it can never be had."""
    partition = partition_size(_spec(slurm_lab))
    assert partition is not None and partition[1] == slurm_lab.nnodes
    wanted = slurm_lab.nnodes + 5
    with pytest.raises(HostError, match=rf"Slurm: the job needs {wanted} node\(s\) .* partition '{partition[0]}' has "
                                        rf"{slurm_lab.nnodes}: set nodes = {slurm_lab.nnodes} .* in the Slurm file"):
        SlurmAllocation(_spec(slurm_lab), nodes=wanted)
    assert partition_size(_spec(slurm_lab, partition="nosuch")) is None  # salloc names the bad partition
    # the Slurm file's own size is what is asked for; the caller's allocation is never refused
    assert allocation_refusal(_spec(slurm_lab, nodes=slurm_lab.nnodes), wanted) is None
    assert allocation_refusal(_spec(slurm_lab, job_id="4242"), wanted) is None
    assert allocation_refusal(_spec(slurm_lab), wanted, env={"SLURM_JOB_ID": "4242"}) is None
    assert _jobs(slurm_lab) == []


@pytest.mark.slow  # it waits 2 s: the default run is at its 5-minute budget
def test_a_request_no_nodes_answer_is_withdrawn(slurm_lab: SlurmLab):
    names = ",".join(slurm_lab.node_name(i) for i in range(slurm_lab.nnodes))
    slurm_lab.run("scontrol", "update", f"nodename={names}", "state=drain", "reason=test")  # none can take a job
    try:
        withdrawn = r"Slurm: salloc of 1 node\(s\) got none within 2 s \(its request withdrawn\)"
        with pytest.raises(HostError, match=withdrawn):
            SlurmAllocation(_spec(slurm_lab), nodes=1, wait=2)
        assert _jobs(slurm_lab) == []
    finally:
        slurm_lab.run("scontrol", "update", f"nodename={names}", "state=resume")
        slurm_lab.wait_idle()
