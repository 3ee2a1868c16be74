"""The control link between the harness and its filesystem server: JSON lines on a socket pair.

Either side may ``call`` (a request with an id; the caller blocks for the reply) and each
side answers the other's requests on its own threads: the server asks the harness too
(``file_event``: a watched file was created or renamed, and the operation is held until
the harness answers). One reader thread per side routes replies to their callers and runs
each request in a thread of its own, so a request that waits (the harness applying a
fault while the server holds an operation) never blocks the replies it waits for.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Link", "LinkClosed"]


class LinkClosed(ConnectionError):
    """The other side is gone (it died, or closed the link)."""


class Link:
    """One end of the link. ``handler(op, args) -> reply`` answers the other side's requests;
    it may be replaced while the link runs (a standby server's first handler only takes its
    mount orders: ``harness.sim.storage.standby``)."""

    def __init__(self, sock: socket.socket, handler: Callable[[str, dict[str, Any]], Any], name: str,
                 on_close: Callable[[], None] | None = None):
        self._sock = sock
        self.handler = handler
        self._on_close = on_close  # told once the other side is gone: a wait on it can end
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, list[Any]] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._reader = threading.Thread(target=self._read, name=f"{name}-link", daemon=True)
        self._reader.start()

    def call(self, op: str, timeout: float | None = 30.0, **args: Any) -> Any:
        """Send a request and wait for its reply (an error reply raises ``RuntimeError``)."""
        ident = next(self._ids)
        slot: list[Any] = []
        with self._cond:
            if self._closed:
                raise LinkClosed(f"the storage link is closed ({op})")
            self._waiting[ident] = slot
        try:
            self._send({"id": ident, "op": op, "args": args})
            with self._cond:
                if not self._cond.wait_for(lambda: slot or self._closed, timeout):
                    raise TimeoutError(f"no reply to {op!r} over the storage link within {timeout}s")
                if not slot:
                    raise LinkClosed(f"the storage link closed before {op!r} was answered")
        finally:
            with self._cond:
                self._waiting.pop(ident, None)
        reply = slot[0]
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply.get("result")

    def _send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self._send_lock:
            try:
                self._sock.sendall(data)
            except OSError as e:
                raise LinkClosed(f"the storage link is closed: {e}") from None

    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = self._sock.recv(65536)
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    self._dispatch(json.loads(line))
        except OSError:
            pass
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            if self._on_close is not None:
                self._on_close()

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "op" not in message:  # a reply
            with self._cond:
                slot = self._waiting.get(message["id"])
                if slot is not None:
                    slot.append(message)
                    self._cond.notify_all()
            return
        threading.Thread(target=self._answer, args=(message,), daemon=True).start()

    def _answer(self, message: dict[str, Any]) -> None:
        try:
            reply: dict[str, Any] = {"id": message["id"], "result": self.handler(message["op"], message["args"])}
        except Exception as e:  # the caller raises it: never a dead thread and a hung caller
            reply = {"id": message["id"], "error": f"{type(e).__name__}: {e}"}
        try:
            self._send(reply)
        except LinkClosed:
            pass

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
