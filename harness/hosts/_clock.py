"""A host's clock offset, measured over the connection it already has.

Events are stamped where they happen (``harness.events``): ``ts`` = ``time.time()`` and
``mono`` = ``time.monotonic()`` of the host, and the timeline orders by ``mono``. A host's
monotonic clock counts from its own boot, so its ``mono`` means nothing here until it is
moved onto ours; its wall clock is as good as its NTP. Both are measured, in one exchange.

The exchange is NTP's, over the lease (``_remote.lease``), the connection's own session,
which stays open for as long as the connection does: we read our clocks (t0), write
``ping N`` on the lease's stdin, the lease reads its clocks (r) and answers at once, and
we read ours again when the answer is in (t3). Nothing is started per sample: one sample
is one round trip on a channel that is open already.

The bound is not statistical. The host read r at some instant between t0 and t3, so the
offset ``r - t`` lies in ``[r - t3, r - t0]``, an interval one round trip wide. Every
sample gives such an interval; the offset lies in all of them, so in their intersection,
and the estimate is its midpoint with the error bound its half-width: at most half the
shortest round trip, less when samples straddle it from both sides. This holds whatever
the delays are, asymmetric ones included; it assumes only that neither clock is stepped
and that their rates agree during the few milliseconds of the measurement (crystals
differ by < 100 ppm: 0.1 µs over a 1 ms round trip). If the intervals do not meet (a
clock was stepped mid-way), the shortest round trip's sample is used alone.

Between measurements the two clocks drift apart (NTP-disciplined clocks: microseconds per
second; free-running ones up to ~100 µs/s), so a long run measures again now and then
(``ClockOffset.measured_at`` says when this one was taken).
"""

from __future__ import annotations

import json
import math
import os
import selectors
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from harness.hosts._errors import HostError, HostTimeout, HostUnreachable

__all__ = ["ClockOffset", "ClockSample", "LeaseChannel", "Pinger", "estimate", "measure_offset"]

#: samples per measurement by default: the best of 8 round trips, ~8 RTTs of time
SAMPLES = 8


@dataclass(frozen=True)
class ClockSample:
    """One exchange: our clocks when the ping left (``sent_*``) and when the answer came
    (``got_*``), the host's when it answered (``host_*``)."""

    sent_wall: float
    sent_mono: float
    host_wall: float
    host_mono: float
    got_wall: float
    got_mono: float

    @property
    def rtt(self) -> float:
        return self.got_mono - self.sent_mono


@dataclass(frozen=True)
class ClockOffset:
    """How far a host's clocks are from ours: host = ours + offset, each within
    ``error_bound_s`` (at ``measured_at``). ``ClockOffset()`` is "the same clocks"."""

    offset_s: float = 0.0  # host's time.time() minus ours
    mono_offset_s: float = 0.0  # host's time.monotonic() minus ours
    error_bound_s: float = 0.0  # both offsets are within this of the truth
    rtt_s: float = 0.0  # the shortest round trip of the measurement
    samples: int = 0
    measured_at: float = 0.0  # our time.monotonic() at the end of the measurement

    def local_wall(self, host_ts: float) -> float:
        """A host's ``time.time()`` reading on our wall clock."""
        return host_ts - self.offset_s

    def local_mono(self, host_mono: float) -> float:
        """A host's ``time.monotonic()`` reading on our monotonic clock."""
        return host_mono - self.mono_offset_s

    def correct(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``event`` with its ``ts`` and ``mono`` on our clocks."""
        fixed = dict(event)
        if isinstance(fixed.get("ts"), (int, float)):
            fixed["ts"] = self.local_wall(fixed["ts"])
        if isinstance(fixed.get("mono"), (int, float)):
            fixed["mono"] = self.local_mono(fixed["mono"])
        return fixed


def _interval_estimate(intervals: list[tuple[float, float]], fallback: tuple[float, float]) -> tuple[float, float]:
    """(midpoint, half-width) of the intervals' intersection; of ``fallback`` when empty."""
    low, high = max(lo for lo, _ in intervals), min(hi for _, hi in intervals)
    if low > high:
        low, high = fallback
    return (low + high) / 2, (high - low) / 2


def estimate(samples: Iterable[ClockSample]) -> ClockOffset:
    """The offset the samples prove, and its bound (see the module doc)."""
    taken = list(samples)
    if not taken:
        raise ValueError("estimate() needs at least one sample")
    best = min(taken, key=lambda s: s.rtt)
    wall, wall_bound = _interval_estimate(
        [(s.host_wall - s.got_wall, s.host_wall - s.sent_wall) for s in taken],
        (best.host_wall - best.got_wall, best.host_wall - best.sent_wall))
    mono, mono_bound = _interval_estimate(
        [(s.host_mono - s.got_mono, s.host_mono - s.sent_mono) for s in taken],
        (best.host_mono - best.got_mono, best.host_mono - best.sent_mono))
    return ClockOffset(wall, mono, max(wall_bound, mono_bound), best.rtt, len(taken), taken[-1].got_mono)


class Pinger(Protocol):
    """Anything that can take one clock sample: ``SshHost``, a ``LeaseChannel``."""

    def ping(self, timeout: float = ...) -> ClockSample: ...


def measure_offset(host: Pinger, samples: int = SAMPLES, timeout: float = 10.0) -> ClockOffset:
    """``samples`` round trips over ``host``'s lease, the offset they prove and its bound.
    ``timeout`` bounds each round trip."""
    if not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples={samples!r} must be an int >= 1")
    return estimate(host.ping(timeout) for _ in range(samples))


class LeaseChannel:
    """The lease's stdin (``write_fd``, ours to close: its EOF ends the lease) and stdout
    (``read_fd``, not ours) as a line channel. Thread-safe: one exchange at a time (a
    heartbeat goes out meanwhile: it waits for no answer)."""

    def __init__(self, write_fd: int, read_fd: int, label: str):
        self.label = label
        self._write_fd: int | None = write_fd
        self._read_fd = read_fd
        self._pending = b""
        self._sent = 0
        self._lock = threading.Lock()  # one exchange (a question and its answer) at a time
        self._writing = threading.Lock()  # one line written at a time

    def readline(self, timeout: float, gone: int | None = None) -> bytes | None:
        """The next line from the lease (without its newline); None at EOF. Raises
        ``HostTimeout`` (with no message: the caller says what it waited for) after
        ``timeout`` s, ``_Gone`` once ``gone`` (an fd: a process's pidfd) turns readable
        first."""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self._read_fd, selectors.EVENT_READ)
            if gone is not None:
                sel.register(gone, selectors.EVENT_READ)
            while b"\n" not in self._pending:
                left = deadline - time.monotonic()
                ready = {key.fd for key, _ in sel.select(left)} if left > 0 else set()
                if not ready:
                    raise HostTimeout("")
                if self._read_fd not in ready:
                    raise _Gone()
                chunk = os.read(self._read_fd, 65536)
                if not chunk:
                    return None
                self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line

    def _send(self, line: bytes) -> None:
        with self._writing:
            if self._write_fd is None:
                raise HostError(f"host {self.label}: not open")
            try:
                os.write(self._write_fd, line)
            except BrokenPipeError:
                raise HostUnreachable(f"host {self.label}: the connection is closed") from None

    def beat(self) -> bool:
        """A heartbeat line (the lease counts any line); False once that cannot be."""
        try:
            self._send(b"beat\n")
        except HostError:
            return False
        return True

    def ask(self, send: Callable[[int], bool], timeout: float, what: str,
            gone: int | None = None) -> dict[str, Any] | None:
        """A question sent elsewhere, answered here: ``send(q)`` sends it, numbered ``q``,
        to whoever answers it (a command's supervisor: ``RemoteProcess``), which sends its
        answer to the lease, which writes it on this channel (``_remote``'s ``.answers``).
        The answer (``{"answer": q, ...}``); None when ``send`` could not send it (False)
        or whoever answers is gone: ``gone`` (a pidfd of the command's local client)
        turned readable. Then a ping to the lease is the barrier: an answer sent before
        the answerer ended reaches the lease before the ping, and is taken if it comes.
        ``HostTimeout`` naming ``what`` past ``timeout`` s; answers to earlier questions
        that timed out, and pongs, are skipped."""
        with self._lock:
            self._sent += 1
            question = self._sent
            if not send(question):
                return None
            deadline = time.monotonic() + timeout
            try:
                return self._await_answer(question, deadline, gone)
            except _Gone:
                return self._answer_before_pong(question, deadline)
            except HostTimeout:
                raise HostTimeout(f"host {self.label}: no answer to {what} within {timeout:g} s") from None

    def _await_answer(self, question: int, deadline: float, gone: int | None) -> dict[str, Any]:
        while True:
            line = self.readline(max(0.0, deadline - time.monotonic()), gone)
            if line is None:
                raise HostUnreachable(f"host {self.label}: the connection is closed")
            answer = _answer(line)
            if answer is not None and answer["answer"] == question:
                return answer

    def _answer_before_pong(self, question: int, deadline: float) -> dict[str, Any] | None:
        """The answer to ``question`` if the lease passes it on before it answers a ping
        sent now (under ``_lock``); None when the pong comes first."""
        self._sent += 1
        ping = self._sent
        self._send(b"ping %d\n" % ping)
        while True:
            line = self.readline(max(0.0, deadline - time.monotonic()))
            if line is None:
                raise HostUnreachable(f"host {self.label}: the connection is closed")
            answer = _answer(line)
            if answer is not None and answer["answer"] == question:
                return answer
            pong = _pong(line)
            if pong is not None and pong[0] == ping:
                return None

    def ping(self, timeout: float = 10.0) -> ClockSample:
        """One clock sample (an answer to an earlier, timed-out ping is skipped)."""
        with self._lock:
            self._sent += 1
            n = self._sent
            sent_wall, sent_mono = time.time(), time.monotonic()
            self._send(b"ping %d\n" % n)
            deadline = sent_mono + timeout
            while True:
                try:
                    line = self.readline(max(0.0, deadline - time.monotonic()))
                except HostTimeout:
                    raise HostTimeout(f"host {self.label}: no answer to a clock ping within {timeout:g} s") from None
                got_mono, got_wall = time.monotonic(), time.time()
                if line is None:
                    raise HostUnreachable(f"host {self.label}: the connection is closed")
                answer = _pong(line)
                if answer is not None and answer[0] == n:
                    return ClockSample(sent_wall, sent_mono, answer[1], answer[2], got_wall, got_mono)

    def close(self) -> None:
        """Say ``bye`` (the lease removes its work dir at once: nothing is to be read from
        it again) and close our end of the lease's stdin: the lease ends. Idempotent."""
        with self._writing:
            fd, self._write_fd = self._write_fd, None
            if fd is not None:
                try:
                    os.write(fd, b"bye\n")
                except OSError:  # the connection is gone already: the lease keeps its events a while
                    pass
                os.close(fd)


class _Gone(Exception):
    """``LeaseChannel.readline``: the process whose end it also waited for ended first."""


def _answer(line: bytes) -> dict[str, Any] | None:
    """A line that is an answer (a JSON object with an int ``answer``); None otherwise."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("answer"), int) else None


def _pong(line: bytes) -> tuple[int, float, float] | None:
    """(n, wall, mono) of a well-formed answer; None for anything else."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    n, wall, mono = data.get("pong"), data.get("wall"), data.get("mono")
    if isinstance(n, int) and isinstance(wall, float) and isinstance(mono, float) \
            and math.isfinite(wall) and math.isfinite(mono):
        return n, wall, mono
    return None
