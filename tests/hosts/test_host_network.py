"""Network faults on hosts, by nftables there (``harness.sim.places.hosts.network``).

Two sshd hosts of ``SshdLab`` (each a network namespace with root: nft works there). What
is checked, each where it can be seen: the table on the host (``nft list`` over a fresh
connection), who still gets through (the harness's own connection does; another host does
not), the table gone when its owner goes, however it goes (close, or this side's ssh
SIGKILLed as a dying controller's would be), and a job on the two hosts riding out a
partition of node 1 and its heal, as the bundled ``flapping_link`` scenario does locally.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness import Cluster
from harness.errors import ConfigError
from harness.faults import AtStep, Bandwidth, FaultRefused, Heal, OnWorldSize, Partition, ScheduledFault
from harness.hosts import HostSpec, RemoteProcess, SshHost
from harness.sim.faults import fault_class
from harness.sim.places.hosts.cgroups import HostNodeCgroup
from harness.sim.places.hosts.network import HostFirewall
from harness.sim.places.hosts.rules import HostLoss, HostPartition, NodeSockets
from harness.sim.places.hosts.shaping import HostShaper
from harness.sim.truth.timeline import HARNESS
from harness.states import WorkerState
from tests.hosts.observe import processes_naming
from tests.hosts.sshd import SshdLab

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "scenarios" / "scripts" / "train.py"
#: how long a dropped connection attempt is given before it counts as silently dropped
_DROPPED_AFTER_S = 1.0


def _reach(lab: SshdLab, from_host: int, address: str, port: int, cgroup: HostNodeCgroup | None = None) -> str:
    """From host ``from_host``'s namespace (in ``cgroup``: as a process of that node), a TCP
    connection to ``address:port``: "banner" (it answered), "refused", or "silence"
    (nothing back: dropped)."""
    joins = cgroup.procs_files() if cgroup is not None else []
    probe = ("import os, socket, sys\n"
             f"for path in {joins!r}: open(path, 'w').write(str(os.getpid()))\n"
             "try:\n"
             f"    s = socket.create_connection(({address!r}, {port}), timeout={_DROPPED_AFTER_S})\n"
             "    s.settimeout(5); print('banner' if s.recv(8).startswith(b'SSH-') else 'other')\n"
             "except ConnectionRefusedError: print('refused')\n"
             "except (socket.timeout, TimeoutError): print('silence')\n")
    namespace = lab.net.namespace_path(from_host)
    out = subprocess.run(["nsenter", f"--net={namespace}", "python3", "-c", probe], capture_output=True,
                         text=True, timeout=30)
    return out.stdout.strip() or out.stderr.strip()


def _table_on(lab: SshdLab, spec: HostSpec, table: str) -> str | None:
    """The table as the host lists it, over a fresh connection of its own (None: none)."""
    with lab.ssh_host(spec) as observer:
        done = observer.run(["nft", "list", "table", "inet", table], check=False)
    return done.stdout if done.returncode == 0 else None


def test_a_partition_on_a_host_spares_the_harness_and_goes_with_its_owner(lab: SshdLab):
    """A partition from everyone on host 0: host 1 can no longer reach it (silence, not a
    refusal), while the harness's connection goes on (the lease answers) and a new one
    from this machine gets in. Healed: host 1 reaches it again. Applied again, then this
    side's ssh clients SIGKILLed (a controller that dies): the host removes the table
    itself, seen over a fresh connection."""
    lab.start(0)
    lab.start(1)
    spec = lab.spec(0)
    assert _reach(lab, 1, spec.address, spec.port) == "banner"
    with lab.ssh_host(spec) as ssh:
        firewall = HostFirewall(ssh)
        firewall.apply({0: [HostPartition((), "both", store=True)]}, store_port=None)
        listed = firewall.listed()
        assert listed is not None and "drop" in listed
        assert _reach(lab, 1, spec.address, spec.port) == "silence"
        ssh.ping()  # the harness's own connection is spared
        assert _table_on(lab, spec, firewall.table) == listed  # and a new one of this machine's gets in
        firewall.apply({}, store_port=None)  # healed
        assert firewall.listed() is None
        assert _reach(lab, 1, spec.address, spec.port) == "banner"
        firewall.apply({0: [HostLoss(1.0)]}, store_port=None)  # every packet lost, but the harness's
        assert _reach(lab, 1, spec.address, spec.port) == "silence"
        ssh.ping()
        for pid in ssh.pids():  # the controller dies: its ssh clients with it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        deadline = time.monotonic() + 20
        while _table_on(lab, spec, firewall.table) is not None:
            assert time.monotonic() < deadline, "the table outlived its owner's connection by 20 s"
            time.sleep(0.2)
    assert _reach(lab, 1, spec.address, spec.port) == "banner"


#: a banner server in a node's cgroup: joins it (argv 1: its cgroup.procs files), listens
#: at argv 2, prints its port, greets each connection as sshd would
_GREETER = """
import os, socket, sys
for path in filter(None, sys.argv[1].split(":")):
    open(path, "w").write(str(os.getpid()))
s = socket.create_server((sys.argv[2], 0))
print(s.getsockname()[1], flush=True)
while True:
    conn, _ = s.accept()
    conn.sendall(b"SSH-2.0-greeter\\r\\n")
    conn.close()
"""


def _node_cgroup(host: SshHost, node: int) -> tuple[HostNodeCgroup, RemoteProcess]:
    """Node ``node``'s cgroup on ``host``, made by its keeper there as a job's is; the keeper."""
    keeper = host.start([host.spec.python, "-m", "harness.sim.places.hosts.cgroup_keeper", "keep", "netcut", str(node)])
    said = json.loads(keeper.first_line(60))
    assert said.get("socket"), said  # the lab's hosts have the unified hierarchy (hybrid or v2)
    return HostNodeCgroup(host, said["version"], said["dirs"], tuple(said["socket"])), keeper


def test_a_fault_on_one_of_two_nodes_of_a_host_falls_on_its_sockets_alone(lab: SshdLab):
    """Nodes 0 and 1 on host 0, each in its own cgroup (its keeper's), each with a server
    at the host's address. Node 1 cut from everyone (and from node 0): node 1 reaches no
    one, and no one reaches it, over the wire (host 1) or the loopback (node 0); node 0
    reaches and is reached by everyone; each node still reaches its own server, and the
    harness's connection goes on. Healed: all reach all again."""
    lab.start(0)
    lab.start(1)
    spec = lab.spec(0)
    address, other = spec.address, lab.spec(1)
    with lab.ssh_host(spec) as ssh:
        cgroups, keepers = zip(*(_node_cgroup(ssh, node) for node in (0, 1)), strict=True)
        greeters = [subprocess.Popen(["nsenter", f"--net={lab.net.namespace_path(0)}", sys.executable, "-c",
                                      _GREETER, ":".join(c.procs_files()), address], stdout=subprocess.PIPE,
                                     text=True) for c in cgroups]
        try:
            ports = [int(g.stdout.readline()) for g in greeters if g.stdout is not None]
            sockets = {n: NodeSockets(n, *c.socket_cgroup()) for n, c in enumerate(cgroups)}
            firewall = HostFirewall(ssh)
            firewall.apply({1: [HostPartition((), "both", store=True, neighbours=(0,))]}, None, sockets)
            probes = {  # (from host, to address, port, as node) -> what it gets; all at once (a silence takes 1 s)
                (0, address, ports[0], 0): "banner", (0, address, ports[0], 1): "silence",  # loopback: to node 0
                (0, address, ports[1], 0): "silence", (0, address, ports[1], 1): "banner",  # loopback: to node 1
                (1, address, ports[0], None): "banner", (1, address, ports[1], None): "silence",  # wire: in
                (0, other.address, other.port, 0): "banner", (0, other.address, other.port, 1): "silence"}  # out
            with ThreadPoolExecutor(len(probes)) as pool:
                got = dict(zip(probes, pool.map(lambda p: _reach(lab, *p[:3], None if p[3] is None else cgroups[p[3]]),
                                                probes), strict=True))
            assert got == probes
            ssh.ping()
            firewall.apply({}, None, sockets)
            with ThreadPoolExecutor(2) as pool:
                healed = list(pool.map(lambda p: _reach(lab, *p), [(0, address, ports[0], cgroups[1]),
                                                                   (1, address, ports[1])]))
            assert healed == ["banner", "banner"]
        finally:
            for greeter in greeters:
                greeter.kill()
                greeter.communicate()
            for keeper in keepers:
                keeper.terminate()
                keeper.communicate(30)
                keeper.close()
        assert not any(os.path.exists(d) for c in cgroups for d in c.distinct())


_RECEIVER = """
import socket, sys, time
s = socket.create_server((sys.argv[1], 0))
print(s.getsockname()[1], flush=True)
s.settimeout(30)
conn, _ = s.accept()
conn.settimeout(5)
moved, first = 0, None
while first is None or time.monotonic() - first < float(sys.argv[2]):
    data = conn.recv(1 << 16)
    if not data:
        break
    first = first or time.monotonic()
    moved += len(data)
print(moved, flush=True)
"""
_SENDER = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
end, chunk = time.monotonic() + float(sys.argv[3]), bytes(1 << 16)
try:
    while time.monotonic() < end:
        s.sendall(chunk)
except OSError:
    pass
"""


def _moved(lab: SshdLab, sender: int, receiver: int, seconds: float = 0.5) -> int:
    """Bytes host ``sender`` got across to host ``receiver`` over TCP in ``seconds``
    (from the first byte): the way the job's peers talk."""
    def inside(host: int, *argv: str) -> list[str]:
        return ["nsenter", f"--net={lab.net.namespace_path(host)}", "python3", "-c", *argv]

    address = lab.spec(receiver).address
    with subprocess.Popen(inside(receiver, _RECEIVER, address, repr(seconds)), stdout=subprocess.PIPE,
                          text=True) as rx:
        assert rx.stdout is not None
        port = rx.stdout.readline().strip()
        subprocess.run(inside(sender, _SENDER, address, port, repr(seconds + 2)), timeout=60, check=True)
        return int(rx.communicate(timeout=30)[0].strip() or 0)


def _shaping_missing(lab: SshdLab, host: int) -> str | None:
    """Why host ``host`` of the lab cannot shape its links (this kernel has no ifb), or None."""
    namespace = lab.net.namespace(host)
    added = subprocess.run(["ip", "-n", namespace, "link", "add", "pe_probe", "type", "ifb"], capture_output=True,
                           text=True)
    if added.returncode != 0:
        return f"bandwidth on a host needs the ifb module: {added.stderr.strip()}"
    subprocess.run(["ip", "-n", namespace, "link", "del", "pe_probe"], capture_output=True)
    return None


def test_bandwidth_on_a_host_shapes_its_links_each_way_and_spares_the_harness(lab: SshdLab):
    """1 mbit/s on host 0's links: what host 1 sends it and what it sends host 1 in half a
    second slow by an order of magnitude (62.5 kB, the bucket's burst and slack allowed),
    while the harness's own connection is not limited (4 MB through it, 32 s at that rate, come at
    once). Cleared: full speed. Shaped again, then this side's ssh clients SIGKILLed (a
    controller that dies): the host removes the qdiscs and the ifb device itself."""
    lab.start(0)
    lab.start(1)
    if _shaping_missing(lab, 0):
        pytest.skip(_shaping_missing(lab, 0))
    spec = lab.spec(0)
    assert _moved(lab, 1, 0) > 625_000  # unshaped: far above 1 mbit/s
    with lab.ssh_host(spec) as ssh:
        firewall = HostFirewall(ssh)
        shaper = HostShaper(ssh, firewall.control(), firewall.table)
        shaper.shape(1_000_000, [lab.spec(1).address])
        shown = shaper.shown()
        assert "qdisc htb 1: root" in shown and "qdisc ingress ffff:" in shown, shown
        assert _moved(lab, 1, 0) < 625_000 and _moved(lab, 0, 1) < 625_000
        assert len(ssh.run(["head", "-c", "4000000", "/dev/zero"], timeout=10).stdout) == 4_000_000
        shaper.clear()
        assert "htb" not in shaper.shown()
        assert _moved(lab, 1, 0) > 625_000
        shaper.shape(1_000_000, [lab.spec(1).address])
        for pid in ssh.pids():  # the controller dies: its ssh clients with it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        deadline = time.monotonic() + 20
        while True:
            links = subprocess.run(["ip", "-n", lab.net.namespace(0), "-o", "link"], capture_output=True,
                                   text=True).stdout
            qdiscs = subprocess.run(["tc", "-n", lab.net.namespace(0), "qdisc"], capture_output=True,
                                    text=True).stdout
            if shaper.ifb not in links and "htb" not in qdiscs:
                break
            assert time.monotonic() < deadline, f"the shaping outlived its owner's connection by 20 s: {qdiscs}"
            time.sleep(0.2)


def test_a_host_without_nft_says_so_in_one_line(lab: SshdLab, tmp_path: Path):
    """A host where ``nft`` cannot run: one line naming the host and what a network fault
    needs there, never a traceback wall."""
    lab.start(0)
    with lab.ssh_host(lab.spec(0)) as ssh:
        firewall = HostFirewall(ssh)
        firewall.table = "not a table name"  # nft refuses it as it would refuse a host without root
        with pytest.raises(Exception) as info:
            firewall.apply({0: [HostPartition((), "both")]}, store_port=None)
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f"host {lab.spec(0).label}: nft -f exited 1: ")
        assert ": Error: syntax error" in message, message  # nft's own words, not its ^^^ marker line
        assert message.endswith("network faults on a host need nftables (nft) and root there")


@pytest.mark.slow  # the default run has the same cut and heal in a job: asymmetric_store_partition on netns hosts
def test_a_partitioned_node_on_a_host_is_left_behind_and_rejoins_when_healed(lab, netns_hosts, tmp_path):
    """Node 1 (host 1) cut from everyone at step 5: its heartbeats to the store (the
    forwarded port on its loopback) and its gloo peers are dropped on its host, node 0 goes
    on alone; healed once it does, node 1 rejoins. The table is there while the cut lasts
    and gone after; the job's events kept coming over the spared connection throughout."""
    with Cluster(nnodes="1:2", nproc_per_node=1, max_restarts=0, hosts=netns_hosts,
                 start_method="zygote") as cluster:  # each round's worker forks from its agent's zygote
        job = cluster.launch(str(TRAIN), "--steps", "60", "--step-time", "0.05", "--ckpt-dir",
                             str(tmp_path))
        job.schedule([ScheduledFault(Partition(node=1, peers="all"), AtStep(step=5, rank=0)),
                      ScheduledFault(Heal(node=1), OnWorldSize(1), after_previous=True)])
        deadline = time.monotonic() + 120
        while not job.timeline.faults():
            ended = len(job.timeline.events("node_exit", HARNESS)) == 2
            assert time.monotonic() < deadline and not ended, f"{job.timeline.format()}\n{job.agent_log(0)}"
            time.sleep(0.05)
        during = job.place.network.firewall(1).listed()  # before the heal: node 0 re-forms alone first
        result = job.wait(timeout=180)
        assert result.state == WorkerState.SUCCEEDED, job.timeline.format()
        assert job.timeline.world_sizes() == [2, 1, 2], job.timeline.format()
        assert during is not None and "drop" in during, during
        assert job.place.network.firewall(1).listed() is None
        assert job.network.open_faults() == {}
        [fault, heal] = [*job.timeline.faults(), *job.timeline.events("heal", HARNESS)]
        assert (fault["fault"], fault["target_node"], fault["peers"]) == ("partition", 1, "all")
        assert heal["healed"] == ["partition/packet_loss"]


@pytest.mark.slow  # the default run checks the same rules on a host without a job (..._falls_on_its_sockets_alone)
def test_a_partitioned_node_that_shares_its_host_is_left_behind_alone(lab, netns_cgroup_hosts, tmp_path):
    """Three nodes on two hosts: nodes 0 and 2 share host 0, which lists cgroups. Node 2 cut
    from everyone at step 5: its peers on the wire (node 1) and on its host's loopback
    (node 0) and the store lose it, and nodes 0 and 1 go on as two; healed then, node 2
    rejoins. Nothing of node 0's was cut: the job never went below two."""
    with Cluster(nnodes="2:3", nproc_per_node=1, max_restarts=0, hosts=netns_cgroup_hosts,
                 start_method="zygote") as cluster:
        job = cluster.launch(str(TRAIN), "--steps", "60", "--step-time", "0.05", "--ckpt-dir", str(tmp_path))
        job.schedule([ScheduledFault(Partition(node=2, peers="all"), AtStep(step=5, rank=0)),
                      ScheduledFault(Heal(node=2), OnWorldSize(2), after_previous=True)])
        deadline = time.monotonic() + 120
        while not job.timeline.faults():
            assert time.monotonic() < deadline, f"{job.timeline.format()}\n{job.agent_log(0)}"
            time.sleep(0.05)
        during = job.place.network.firewall(2).listed()
        result = job.wait(timeout=240)
        assert result.state == WorkerState.SUCCEEDED, job.timeline.format()
        assert job.timeline.world_sizes() == [3, 2, 3], job.timeline.format()
        assert during is not None and 'socket cgroupv2' in during and "meta priority set" in during, during
        assert job.place.network.firewall(2).listed() is None


def test_network_faults_hosts_do_not_do_are_refused_in_one_line(lab, netns_hosts):
    """link_down (it would cut the harness's own connection), and a network fault on a node
    that shares its host (three nodes on two hosts: nodes 0 and 2 share host 0), which lists
    no cgroups (a partition there could not tell their sockets apart): refused when
    injected and when called, nothing recorded. bandwidth on node 1, alone on host 1,
    is carried out there (its links' qdiscs) and healed."""
    with Cluster(nnodes="2:3", nproc_per_node=1, hosts=netns_hosts, start_method="spawn",
                 check_invariants=False) as cluster:
        job = cluster.launch(str(ROOT / "tests" / "scripts" / "sleeper.py"))
        with pytest.raises(FaultRefused, match=r"Bandwidth\(node=0.* refused: host .* carries nodes 0, 2 of this job"):
            job.inject(Bandwidth(node=0, rate="1mbit"))
        with pytest.raises(FaultRefused, match=r"refused: link_down is not done on hosts: it would cut the host off"):
            job.link_down(1)
        with pytest.raises(FaultRefused) as info:
            job.inject(Partition(node=0))
        assert str(info.value).endswith(f"refused: host {netns_hosts[0].label} carries nodes 0, 2 of this job, and "
                                        "a partition of one of them alone needs 'cgroups' in that host's capabilities "
                                        "(each node's own cgroup there, by which nft tells their sockets apart), or "
                                        "node 0 alone on a host (placement=)")
        with pytest.raises(FaultRefused, match=r"peer node 0's host .* also carries node\(s\) 2, which a cut from "
                                               r"it would cut too"):
            job.partition(1, peers=[0])
        assert not job.timeline.events("fault", HARNESS) and job.pending_faults() == []
        with pytest.raises(ConfigError, match="must be a node index"):
            job.place.network.partition(7)
        job.wait_for_state(WorkerState.HEALTHY, timeout=90)  # node 1 started on host 1: its connection is open
        missing = _shaping_missing(lab, 1)
        if missing:  # the refusals above were checked all the same
            pytest.skip(f"{missing} (the refusals were checked)")
        job.bandwidth(1, "2mbit")
        [fault] = job.timeline.events("fault", HARNESS)
        assert (fault["fault"], fault["target_node"], fault["bits_per_second"]) == ("bandwidth", 1, 2_000_000)
        shaper = job.place.network._shaper(1)
        assert "rate 2Mbit" in subprocess.run(["tc", "-n", lab.net.namespace(1), "class", "show", "dev",
                                               shaper.ifb], capture_output=True, text=True).stdout
        assert job.place.network.faulted() == {1: ["bandwidth"]}
        job.heal(1)
        assert job.timeline.events("heal", HARNESS)[-1]["healed"] == ["bandwidth"]
        assert "htb" not in shaper.shown()


@pytest.mark.slow  # 11 s: the default run is at its 5-minute budget
def test_a_host_unreachable_for_a_while_is_ridden_out(lab, netns_hosts, tmp_path):
    """host_unreachable(node=1, seconds=3) at step 5: host 1 drops this machine's SSH
    connections (the store rides them, so node 1 goes quiet to it and is fenced; node 0
    re-forms alone); the host lifts the cut itself, the same connection resumes (TCP
    retransmits), node 1 rejoins: [2, 1, 2], success. ``host_reachable`` says the
    connection was kept and how long the host was out of reach; the events node 1 wrote
    while it was cut off came late, but came; no cut table is left on the host."""
    with Cluster(nnodes="1:2", nproc_per_node=1, max_restarts=0, hosts=netns_hosts,
                 start_method="zygote") as cluster:
        job = cluster.launch(str(TRAIN), "--steps", "120", "--step-time", "0.05", "--ckpt-dir", str(tmp_path))
        job.inject(fault_class("host_unreachable")(node=1, seconds=3), AtStep(step=5, rank=0))
        result = job.wait(timeout=180)
        assert result.state == WorkerState.SUCCEEDED, job.timeline.format()
        assert job.timeline.world_sizes() == [2, 1, 2], job.timeline.format()
        [fault] = job.timeline.faults()
        assert (fault["fault"], fault["target_node"], fault["seconds"]) == ("host_unreachable", 1, 3)
        back = _host_reachable(job)
        assert back["connection"] == "kept" and back["unreachable_s"] >= 3, back
        cut_at = fault["mono"]
        written_while_cut = [e for e in job.timeline.events(node=1) if cut_at < e["mono"] < cut_at + 3]
        assert written_while_cut, job.timeline.format()  # relayed once the connection resumed
        table = job.place.network.firewall(1).table + "_cut"
    assert _table_on(lab, netns_hosts[1], table) is None


@pytest.mark.slow
def test_a_host_unreachable_past_the_clients_patience_loses_the_node_and_is_reconnected(lab, netns_hosts,
                                                                                          tmp_path):
    """host_unreachable(node=1, seconds=20): past SILENT_LINK_S (15 s) this machine's ssh
    client gives the connection up, and node 1 with it (its agent's client exits 255); node
    0 goes on alone and succeeds. When the cut is lifted the harness connects again and says
    so (``host_reachable``: "reconnected"), with how many of node 1's event lines never came,
    which it read over the new connection from the file the old lease kept and put on the
    timeline: node 1's own account of the cut is there. The old lease ends what node 1 ran
    on the host at once (its sshd hears the reset), else within its lost_after, and removes
    the kept file once read: nothing is left there."""
    with Cluster(nnodes="1:2", nproc_per_node=1, max_restarts=0, hosts=netns_hosts,
                 start_method="zygote") as cluster:
        job = cluster.launch(str(TRAIN), "--steps", "300", "--step-time", "0.05", "--ckpt-dir", str(tmp_path))
        job.wait_for_state(WorkerState.HEALTHY, timeout=90)
        old_work_dir = job.place.connection(1)[0].work_dir
        job.inject(fault_class("host_unreachable")(node=1, seconds=20), AtStep(step=5, rank=0))
        result = job.wait(timeout=240)
        assert result.state == WorkerState.SUCCEEDED, job.timeline.format()
        exits = {e["target_node"]: e for e in job.timeline.events("node_exit", HARNESS)}
        assert exits[1]["exitcode"] == 255, exits
        back = _host_reachable(job)
        assert back["connection"] == "reconnected" and back["unreachable_s"] >= 20, back
        assert set(back["missed_events"]) == {"1"} and back["missed_events"]["1"] > 0, back
        assert job.place.connection(1)[0].work_dir != old_work_dir  # the new connection
        # node 1's own account of the cut (its workers stopped, fenced off the store) was
        # written on the host after the cut stalled its relay: it came over the new connection
        cut_at = job.timeline.faults()[0]["mono"]
        assert "fenced" in [e["kind"] for e in job.timeline.events(node=1) if e["mono"] > cut_at], job.timeline.format()
    deadline = time.monotonic() + 60  # the old lease ends what it ran: at once (the host's sshd hears
    while processes_naming(old_work_dir) or os.path.exists(old_work_dir):  # the reset), else after lost_after
        assert time.monotonic() < deadline, f"left on the host: {processes_naming(old_work_dir)}"
        time.sleep(0.5)


def _host_reachable(job) -> dict:
    """The job's ``host_reachable`` event, once it came (recorded from a thread, after the
    host answered again: maybe after the job's end)."""
    deadline = time.monotonic() + 60
    while not job.timeline.events("host_reachable", HARNESS):
        assert time.monotonic() < deadline, job.timeline.format()
        time.sleep(0.1)
    [back] = job.timeline.events("host_reachable", HARNESS)
    return back
