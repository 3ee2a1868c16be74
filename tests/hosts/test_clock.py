"""A host's clock offset (``harness.hosts._clock``): the estimate and its bound from samples
(no host), the correction proven against a lease whose clocks run 5 s ahead (a local
process, no sshd), and measured over real sshd hosts: hosts on this machine share its
clocks, so their offset must be 0 within the bound, and a host in a time namespace whose
monotonic clock runs 1000 s ahead must measure +1000 s within it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.hosts import ClockOffset, ClockSample, HostError, measure_offset
from harness.hosts._clock import LeaseChannel, estimate
from harness.hosts._ssh import _remote_source
from tests.hosts.sshd import SshdHost, SshdLab

FAKE_CLOCK = str(Path(__file__).with_name("fake_clock.py"))
#: the largest bound accepted on this machine's loopback namespaces: a round trip is ~0.1 ms
#: idle; a starved 2-core runner can stretch the best of 8 to milliseconds, never to this
LOOPBACK_BOUND_S = 0.05


def sample(true_offset: float, at: float, out: float, back: float, mono_offset: float = 0.0) -> ClockSample:
    """A ping sent at our time ``at`` that takes ``out`` s there and ``back`` s back."""
    host = at + out
    return ClockSample(at, at, host + true_offset, host + mono_offset, at + out + back, at + out + back)


def within(measured: float, truth: float, offset: ClockOffset) -> bool:
    return abs(measured - truth) <= offset.error_bound_s + 1e-9


def test_the_estimate_is_within_its_bound_whatever_the_delays():
    for out, back in ((0.001, 0.001), (0.0001, 0.0099), (0.0099, 0.0001)):  # asymmetric both ways
        offset = estimate([sample(5.0, 100.0, out, back, mono_offset=-1000.0)])
        assert offset.rtt_s == pytest.approx(out + back)
        assert offset.error_bound_s == pytest.approx((out + back) / 2)
        assert within(offset.offset_s, 5.0, offset) and within(offset.mono_offset_s, -1000.0, offset)


def test_samples_that_straddle_the_truth_narrow_the_bound():
    """Each sample's interval holds the truth; their intersection is narrower than the best
    one alone: here 1 ms wide where the shortest round trip is 10 ms."""
    fast_out = sample(2.0, 0.0, 0.0005, 0.0095)  # interval [2 - 0.0095, 2 + 0.0005]
    fast_back = sample(2.0, 1.0, 0.0095, 0.0005)  # interval [2 - 0.0005, 2 + 0.0095]
    alone = estimate([fast_out])
    both = estimate([fast_out, fast_back])
    assert alone.error_bound_s == pytest.approx(0.005)
    assert both.error_bound_s == pytest.approx(0.0005)
    assert within(both.offset_s, 2.0, both) and both.samples == 2


def test_a_stepped_clock_falls_back_to_the_shortest_round_trip():
    """Intervals that do not meet (the host's clock was stepped between samples): the
    shortest round trip's sample alone."""
    before, after = sample(0.0, 0.0, 0.002, 0.002), sample(1.0, 1.0, 0.001, 0.001)
    offset = estimate([before, after])
    assert offset.rtt_s == pytest.approx(0.002)
    assert within(offset.offset_s, 1.0, offset) and offset.error_bound_s == pytest.approx(0.001)


def test_correct_moves_an_event_onto_our_clocks():
    offset = ClockOffset(offset_s=5.0, mono_offset_s=1000.0)
    event = {"kind": "step", "ts": 105.0, "mono": 1010.0, "node": 1}
    assert offset.correct(event) == {"kind": "step", "ts": 100.0, "mono": 10.0, "node": 1}
    assert event["ts"] == 105.0  # a copy
    assert ClockOffset().correct({"kind": "x"}) == {"kind": "x"}
    with pytest.raises(ValueError, match="at least one sample"):
        estimate([])


def test_a_lease_five_seconds_ahead_is_corrected(tmp_path: Path):
    """The real lease (``_remote.lease``) run by a process that adds 5 s to both its
    clocks: the measured offset is +5 s within the bound, and what the host stamps is
    moved back onto ours."""
    argv = [sys.executable, FAKE_CLOCK, "5", "-c", _remote_source(), "lease", "0", "0", str(tmp_path)]
    lease = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert lease.stdin is not None and lease.stdout is not None
    channel = LeaseChannel(os.dup(lease.stdin.fileno()), lease.stdout.fileno(), "fake")
    lease.stdin.close()
    try:
        assert channel.readline(30) is not None  # the report
        offset = measure_offset(channel, samples=8)
        assert within(offset.offset_s, 5.0, offset) and within(offset.mono_offset_s, 5.0, offset)
        assert 0 < offset.error_bound_s <= offset.rtt_s / 2 + 1e-6  # (wall and mono are read apart)
        ping = channel.ping()
        assert abs(offset.local_mono(ping.host_mono) - (ping.sent_mono + ping.got_mono) / 2) <= ping.rtt / 2 \
            + offset.error_bound_s
    finally:
        channel.close()
        assert lease.wait(10) == 0
        lease.stdout.close()
    assert os.listdir(tmp_path) == []  # the lease removed its work dir at EOF


def test_hosts_on_this_machine_have_no_offset(lab: SshdLab, two_hosts: list[SshdHost]):
    """These hosts share this machine's clocks (one kernel): 0 must be within the bound."""
    for host in two_hosts:
        with lab.ssh_host(lab.spec(host.index)) as ssh:
            offset = measure_offset(ssh)
            assert offset.samples == 8 and 0 < offset.rtt_s
            assert offset.error_bound_s <= LOOPBACK_BOUND_S
            assert within(offset.offset_s, 0.0, offset) and within(offset.mono_offset_s, 0.0, offset)


def test_a_host_booted_earlier_is_measured(lab: SshdLab):
    """A host in a time namespace: its monotonic clock 1000 s ahead, its wall clock ours."""
    lab.start(0, monotonic_offset=1000)
    with lab.ssh_host(lab.spec(0)) as ssh:
        offset = measure_offset(ssh, samples=4)
        assert within(offset.mono_offset_s, 1000.0, offset) and within(offset.offset_s, 0.0, offset)
        assert offset.error_bound_s <= LOOPBACK_BOUND_S
        host_mono = float(ssh.run([sys.executable, "-c", "import time; print(time.monotonic())"]).stdout)
        assert host_mono > offset.measured_at + 999  # the namespace is real, not the offset's doing


def test_measuring_needs_an_open_host(lab: SshdLab):
    lab.start(0)
    ssh = lab.ssh_host(lab.spec(0))
    with pytest.raises(HostError, match="not open"):
        measure_offset(ssh)
    with pytest.raises(ValueError, match="samples=0 must be an int >= 1"):
        measure_offset(ssh, samples=0)
    with pytest.raises(ConfigError, match=r"^lost_after=0 must be a number of seconds > 0, or None \(from host"):
        lab.ssh_host(lab.spec(0), lost_after=0)
