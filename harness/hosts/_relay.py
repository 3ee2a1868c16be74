"""A node's events from a host, onto this controller's clocks.

On the host, ``_tail`` follows the node's events file and writes each whole line to its
stdout, the SSH channel (it is started with ``SshHost.start``, so it is owned like any
command: it ends with the relay, the connection or this process). Here one reader thread
takes the lines in order and, for each:

1. checks it: one JSON object (``json.loads``, nothing unpickled or evaluated; NaN and
   Infinity refused), ``kind`` a non-empty string, ``ts`` and ``mono`` finite numbers,
   ``node`` an int or a string and, when the relay serves one node, that node (a host
   does not speak for another node), ``pid`` an int and ``run_id`` a string when present,
   at most ``MAX_LINE`` bytes;
2. moves ``ts`` and ``mono`` onto our clocks with the host's ``ClockOffset``
   (``relay.offset``: assign a new measurement at any time, the next line uses it);
3. hands it to ``sink``.

A line that fails a check is refused with one line naming the host, the file, the line
number and why (``on_refused``; by default a logged warning) and the relay goes on: a
garbage line costs that line, never the stream.

Latency: the node's writers poke the host side's wake socket after each line
(``relay.wake_path`` is what the node's ``$HARNESS_EVENTS_WAKE`` must be), so a line
travels as soon as it is written: one write, one pipe, the channel, our pipe. Lines
written without a poke are read within ``safety`` seconds.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import selectors
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from harness.hosts._clock import ClockOffset
from harness.hosts._errors import HostError, HostTimeout, last_line
from harness.hosts._ssh import SshHost
from harness.hosts._tail import MAX_LINE  # the host side skips longer lines; here they are refused too

__all__ = ["EventRelay", "check_event", "MAX_LINE"]

_log = logging.getLogger(__name__)

_SHOWN = 80  # characters of a refused line quoted in its message


@functools.cache
def _tail_source() -> str:
    return Path(__file__).with_name("_tail.py").read_text()


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_event(line: str, node: int | str | None = None) -> dict[str, Any] | str:
    """The event a line holds, or why it is refused (a phrase). ``node``: the only node the
    line may claim to come from."""
    try:
        data = json.loads(line, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        return f"not JSON ({e})"
    if not isinstance(data, dict):
        return f"not a JSON object but {type(data).__name__}"
    if data.get("relay") == "skipped":
        return f"a line of {data.get('bytes')} bytes, longer than {MAX_LINE}, was skipped on the host"
    problems = [name for name, ok in (
        ("kind", isinstance(data.get("kind"), str) and data["kind"] != ""),
        ("ts", _finite(data.get("ts"))),
        ("mono", _finite(data.get("mono"))),
        ("node", isinstance(data.get("node"), (int, str)) and not isinstance(data.get("node"), bool)),
        ("pid", "pid" not in data or isinstance(data["pid"], int) and not isinstance(data["pid"], bool)),
        ("run_id", "run_id" not in data or isinstance(data["run_id"], str)),
    ) if not ok]
    if problems:
        return f"not an event: bad or missing {', '.join(problems)}"
    if node is not None and data["node"] != node:
        return f"claims node {data['node']!r}, but this relay is node {node!r}'s"
    return data


class EventRelay:
    """Relays the events file ``path`` on ``host`` to ``sink``, corrected by ``offset``.
    ``close()`` it (the lines in the file by then are delivered first).

    ``wake``: the host side's wake socket (default ``path + ".wake"``; ``wake_path`` once
    started); ``node``: refuse lines of any other node; ``safety``: the host side's
    re-read period; ``ready_timeout``: how long the host side may take to start."""

    def __init__(self, host: SshHost, path: str, sink: Callable[[dict[str, Any]], None], *,
                 offset: ClockOffset | None = None, node: int | str | None = None,
                 on_refused: Callable[[str], None] | None = None, wake: str | None = None,
                 safety: float = 0.5, ready_timeout: float = 30.0):
        self.host, self.path, self.sink, self.node = host.spec.label, path, sink, node
        self.offset = offset if offset is not None else ClockOffset()
        self.on_refused = on_refused if on_refused is not None else _log.warning
        self.received = self.refused = 0
        self.lines = 0  # lines of the file read so far (delivered, refused or skipped on the host)
        argv = [host.spec.python, "-I", "-S", "-c", _tail_source(), path, wake or f"{path}.wake", repr(float(safety))]
        self._proc = host.start(argv)
        try:
            ready = self._ready(ready_timeout)
        except BaseException:
            self._proc.close()
            raise
        self.wake_path: str = ready["wake"]
        self.remote_pid: int = ready["pid"]
        self._thread = threading.Thread(target=self._read, name=f"relay {self.host} {path}", daemon=True)
        self._thread.start()

    def _ready(self, timeout: float) -> dict[str, Any]:
        """The host side's first line: it is following the file, its socket bound."""
        stdout = self._stdout()
        with selectors.DefaultSelector() as sel:
            sel.register(stdout.fileno(), selectors.EVENT_READ)
            if not sel.select(timeout):
                raise HostTimeout(f"host {self.host}: the event relay of {self.path} not ready "
                                  f"within {timeout:g} s")
        line = stdout.readline()
        try:
            ready = json.loads(line)
            if isinstance(ready, dict) and ready.get("relay") == "ready":
                return ready
        except ValueError:
            pass
        self._proc.terminate()
        _, err = self._proc.communicate(5.0)
        raise HostError(f"host {self.host}: the event relay of {self.path} did not start "
                        f"(exit {self._proc.returncode}): {last_line(err or line)}")

    def _stdout(self) -> IO[str]:
        stdout = self._proc.stdout
        assert stdout is not None
        return stdout

    def _read(self) -> None:
        stdout = self._stdout()
        skipping = False
        while True:
            try:
                line = stdout.readline(MAX_LINE + 1)
            except (ValueError, OSError):  # closed under us: the host's connection was closed
                return
            if not line:
                return
            whole = line.endswith("\n")
            if skipping:  # the rest of a line refused as too long
                skipping = not whole
                continue
            self.lines += 1
            if not whole and len(line) > MAX_LINE:
                skipping = True
                self._refuse(self.lines, f"longer than {MAX_LINE} characters", line)
                continue
            self._take(self.lines, line)

    def _take(self, number: int, line: str) -> None:
        """Line ``number`` (whole, with its newline): checked, moved onto our clocks and
        delivered, or refused."""
        if len(line) > MAX_LINE + 1:  # read whole where the stream's reader could not (``catch_up``)
            self._refuse(number, f"longer than {MAX_LINE} characters", line)
            return
        event = check_event(line, self.node)
        if isinstance(event, str):
            self._refuse(number, event, line)
            return
        self.received += 1
        self.sink(self.offset.correct(event))

    def catch_up(self, host: SshHost, timeout: float = 10.0) -> int | None:
        """Deliver the lines of the file past those this relay read, which its connection,
        lost, never brought: read over ``host``, a new connection to the same host (once
        the old one's lease ended and keeps the file: ``SshHost.kept``), checked and moved
        onto our clocks as the relay's own. How many lines it read (None: the file is gone).
        The reader of the lost connection is waited for first, so no line comes twice."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise HostTimeout(f"host {self.host}: the lost relay of {self.path} still reading {timeout:g} s on")
        done = host.run(["tail", "-n", f"+{self.lines + 1}", "--", self.path], check=False, timeout=timeout + 20)
        if done.returncode != 0:
            return None
        read = 0
        for text in done.stdout.split("\n")[:-1]:  # the last: "" or a line its writer never finished
            self.lines += 1
            read += 1
            self._take(self.lines, text + "\n")
        return read

    def _refuse(self, number: int, why: str, line: str) -> None:
        self.refused += 1
        shown = line.rstrip("\n")
        shown = shown if len(shown) <= _SHOWN else shown[:_SHOWN] + "..."
        self.on_refused(f"host {self.host}: events {self.path} line {number} refused: {why}: {shown!r}")

    @property
    def running(self) -> bool:
        """Whether lines still come (the host side runs and the reader reads)."""
        return self._thread.is_alive()

    def close(self, timeout: float = 10.0) -> None:
        """End the host side (it forwards what the file holds first), deliver the last
        lines, reap it. Idempotent."""
        self._proc.terminate()
        self._thread.join(timeout)
        self._proc.close()
        if self._thread.is_alive():
            raise HostTimeout(f"host {self.host}: the event relay of {self.path} still delivering "
                              f"{timeout:g} s after it ended")

    def __enter__(self) -> EventRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "ended"
        return (f"<EventRelay {self.host} {self.path} {state}, {self.received} events, {self.refused} refused, "
                f"offset {self.offset.mono_offset_s:+.6f} s ± {self.offset.error_bound_s:.6f}>")

