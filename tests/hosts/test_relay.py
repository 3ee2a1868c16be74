"""A node's events from a host (``harness.hosts.EventRelay``): the line checks on their own,
then real sshd hosts: lines written on the host by the real ``EventWriter`` arrive in
order and on our clocks (from a host whose monotonic clock runs 1000 s ahead), garbage
and over-long lines are refused with one line each and the stream goes on, closing
delivers what the file holds, and what a lost connection never brought is read over a
new one.
"""

from __future__ import annotations

import json
import queue
import time
from typing import Any

import pytest

from harness.hosts import EventRelay, HostError, SshHost, check_event, measure_offset
from harness.hosts._relay import MAX_LINE
from tests.hosts.sshd import SshdLab

#: a node's writer on the host: the runtime's EventWriter, poking the relay after each line;
#: a string in the plan is appended as it is, a dict as a JSON line with "pad" made that long
#: (the argv could not carry a line of a MiB), each poke included
WRITER = r"""
import json, socket, sys
from harness.events import EventWriter
path, wake, plan = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
writer = EventWriter(path, 3, "run-1", wake=wake)
poke = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
for item in plan:
    if isinstance(item, int):
        writer.emit("step", seq=item)
        continue
    if isinstance(item, dict):
        item = json.dumps({**item, "pad": "x" * item["pad"]}) + "\n"
    with open(path, "a") as f:
        f.write(item)
    poke.sendto(b".", wake)
writer.close()
"""
EVENT_TIMEOUT_S = 30.0


class Sink:
    """Collects (our monotonic time on arrival, event) in a queue."""

    def __init__(self) -> None:
        self.events: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
        self.refused: list[str] = []

    def __call__(self, event: dict[str, Any]) -> None:
        self.events.put((time.monotonic(), event))

    def take(self, n: int) -> list[tuple[float, dict[str, Any]]]:
        return [self.events.get(timeout=EVENT_TIMEOUT_S) for _ in range(n)]


def write_on(ssh: SshHost, relay: EventRelay, plan: list[int | str | dict[str, Any]]) -> None:
    ssh.run([ssh.spec.python, "-c", WRITER, relay.path, relay.wake_path, json.dumps(plan)])


# -- the checks --------------------------------------------------------------------------

GOOD = {"ts": 1.5, "mono": 2.5, "node": 0, "pid": 7, "run_id": "r", "kind": "step", "step": 3}


@pytest.mark.parametrize(("line", "why"), [
    ("garbage", "not JSON (Expecting value: line 1 column 1 (char 0))"),
    ("[1, 2]", "not a JSON object but list"),
    (json.dumps({**GOOD, "kind": ""}), "not an event: bad or missing kind"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "mono"}), "not an event: bad or missing mono"),
    (json.dumps(GOOD).replace("1.5", "NaN"), "not JSON (NaN is not a number JSON allows)"),
    (json.dumps({**GOOD, "ts": "1.5", "node": True}), "not an event: bad or missing ts, node"),
    (json.dumps({**GOOD, "pid": 1.0, "run_id": 3}), "not an event: bad or missing pid, run_id"),
    (json.dumps({**GOOD, "node": 1}), "claims node 1, but this relay is node 0's"),
    ('{"relay": "skipped", "bytes": 2000000}', "a line of 2000000 bytes, longer than 1048576, was skipped on the host"),
    ("[" * 100_000, "not JSON (maximum recursion depth exceeded while decoding a JSON array from a unicode string)"),
])
def test_a_line_that_is_not_an_event_is_refused(line: str, why: str):
    assert check_event(line, node=0) == why


def test_an_event_passes_unchanged():
    assert check_event(json.dumps(GOOD), node=0) == GOOD
    assert check_event(json.dumps({**GOOD, "node": "host-a"})) == {**GOOD, "node": "host-a"}


# -- over real hosts ---------------------------------------------------------------------

def test_events_arrive_in_order_on_our_clocks(lab: SshdLab):
    """The host's monotonic clock runs 1000 s ahead of ours; the relay moves every event
    back onto ours: each arrives after it was written (by our clock, within the bound),
    and within seconds of it, never 1000 s off."""
    lab.start(0, monotonic_offset=1000)
    sink = Sink()
    with lab.ssh_host(lab.spec(0)) as ssh:
        offset = measure_offset(ssh)
        assert abs(offset.mono_offset_s - 1000) <= offset.error_bound_s
        with EventRelay(ssh, f"{ssh.work_dir}/events.jsonl", sink, offset=offset, node=3,
                        on_refused=sink.refused.append, safety=60) as relay:
            written_at = time.time()
            write_on(ssh, relay, list(range(50)))
            arrived = sink.take(50)
            assert [event["seq"] for _, event in arrived] == list(range(50))
            for seen_at, event in arrived:
                assert event["node"] == 3 and event["run_id"] == "run-1" and event["kind"] == "step"
                assert -offset.error_bound_s <= seen_at - event["mono"] < 10.0
                assert abs(event["ts"] - written_at) < 10.0
            assert relay.received == 50 and sink.refused == []
    assert "ended, 50 events, 0 refused" in repr(relay)


def test_garbage_is_refused_in_one_line_and_the_stream_goes_on(lab: SshdLab):
    lab.start(0)
    sink = Sink()
    with lab.ssh_host(lab.spec(0)) as ssh, \
            EventRelay(ssh, f"{ssh.work_dir}/events.jsonl", sink, node=3, on_refused=sink.refused.append,
                       safety=60) as relay:
        long = {**GOOD, "node": 3, "pad": MAX_LINE}
        long_line = json.dumps({**long, "pad": "x" * MAX_LINE}) + "\n"
        write_on(ssh, relay, [0, "this is not json\n", 1, '{"kind": "step", "node": 4, "ts": 1, "mono": 1}\n', 2,
                              long, 3])
        assert [event["seq"] for _, event in sink.take(4)] == [0, 1, 2, 3]
        path = relay.path
        assert sink.refused == [
            f"host {ssh.spec.label}: events {path} line 2 refused: not JSON (Expecting value: line 1 column 1 "
            "(char 0)): 'this is not json'",
            f"host {ssh.spec.label}: events {path} line 4 refused: claims node 4, but this relay is node 3's: "
            "'{\"kind\": \"step\", \"node\": 4, \"ts\": 1, \"mono\": 1}'",
            f"host {ssh.spec.label}: events {path} line 6 refused: a line of {len(long_line) - 1} bytes, longer "
            f"than {MAX_LINE}, was skipped on the host: '{{\"relay\": \"skipped\", \"bytes\": {len(long_line) - 1}}}'",
        ]
        assert relay.received == 4 and relay.refused == 3 and relay.running


def test_close_delivers_what_the_file_holds(lab: SshdLab):
    """Lines appended without a poke (a writer that does not know the socket), the
    re-read 60 s away: close() still delivers them all, then the host side is gone."""
    lab.start(0)
    sink = Sink()
    with lab.ssh_host(lab.spec(0)) as ssh:
        relay = EventRelay(ssh, f"{ssh.work_dir}/node0/events.jsonl", sink, safety=60)
        lines = "".join(json.dumps({**GOOD, "seq": i}) + "\n" for i in range(20))
        ssh.run(["sh", "-c", 'mkdir -p "$(dirname "$0")" && printf %s "$1" >> "$0"', relay.path, lines])
        relay.close()
        assert [event["seq"] for _, event in sink.take(20)] == list(range(20))
        assert not relay.running
        assert ssh.run(["test", "-e", relay.wake_path], check=False).returncode == 1  # its socket removed
        relay.close()  # idempotent


def test_a_relay_that_cannot_start_says_why(lab: SshdLab):
    lab.start(0)
    with lab.ssh_host(lab.spec(0)) as ssh:
        with pytest.raises(HostError) as caught:
            EventRelay(ssh, "/tmp/events.jsonl", Sink(), wake=f"{ssh.work_dir}/{'w' * 120}.sock")
        message = str(caught.value)
        assert "\n" not in message
        assert message == (f"host {ssh.spec.label}: the event relay of /tmp/events.jsonl did not start (exit 2): "
                           f"cannot bind the wake socket {ssh.work_dir}/{'w' * 120}.sock: its path is "
                           f"{len(ssh.work_dir) + 126} bytes, over the 107 a Unix socket's may be: give the host a "
                           "shorter work_dir (work_dir in the hosts or Slurm file)")
        assert len(ssh.pids()) == 1  # only the master: the relay's client was reaped


def test_lines_a_lost_connection_never_brought_are_read_over_a_new_one(lab: SshdLab):
    """The connection dies with the relay's host side (its sshd sessions killed): the old
    lease ends what ran there and keeps the events file, marked (``kept``). Lines the
    file got that never came (appended here once the old lease ended: the lab's hosts share
    this machine's files) are read over a new connection from where the relay stopped,
    checked as the relay's own (a garbage one refused, numbered in the file), delivered
    once each; ``release`` lets the old lease remove the dir."""
    lab.start(0)
    sink = Sink()
    with lab.ssh_host(lab.spec(0), keep_missed=60) as lost:
        relay = EventRelay(lost, f"{lost.work_dir}/node0/events.jsonl", sink, node=3, on_refused=sink.refused.append)
        write_on(lost, relay, [0, 1])
        assert [event["seq"] for _, event in sink.take(2)] == [0, 1]
        work_dir = lost.work_dir
        for session in lab.sessions(0):  # the connection drops
            session.kill()
        with lab.ssh_host(lab.spec(0)) as again:
            assert again.kept(work_dir, 30) == "kept"
            with open(relay.path, "a") as f:
                f.write("".join(json.dumps({**GOOD, "node": 3, "seq": i}) + "\n" for i in (2, 3)))
                f.write("not json\n" + json.dumps({**GOOD, "node": 3, "seq": 4}) + "\n" + '{"half": ')
            assert relay.catch_up(again) == 4
            assert [event["seq"] for _, event in sink.take(3)] == [2, 3, 4] and sink.events.empty()
            assert (relay.received, relay.refused, relay.lines) == (5, 1, 6)
            assert sink.refused == [f"host {lost.spec.label}: events {relay.path} line 5 refused: not JSON "
                                    "(Expecting value: line 1 column 1 (char 0)): 'not json'"]
            again.release(work_dir)
            assert again.kept(work_dir, 30) == "gone"
