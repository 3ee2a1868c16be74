"""``HealthCheckServer``: HTTP on loopback saying whether the agent's loop is alive.

torch's open-source server is a no-op. Ours answers ``GET /`` (any path) with 200 and a
JSON body while ``alive_callback()`` (the monotonic time of the agent loop's last
progress) is less than ``timeout`` seconds old, else 503. The agent counts the exit
barrier as progress, so a node waiting for slow peers stays healthy.

A port that cannot be bound (taken by another agent or program) is one warning line and
no server, never a failed job: the check is a monitoring aid, and torch's (a no-op)
never fails a job either.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.errors import ConfigError

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

__all__ = ["HealthCheckServer", "create_healthcheck_server"]

log = logging.getLogger(__name__)


class HealthCheckServer:
    def __init__(self, alive_callback: Callable[[], float], port: int, timeout: float,
                 host: str = "127.0.0.1", clock: Callable[[], float] = time.monotonic):
        if not 0 <= int(port) < 65536:
            raise ConfigError("port", port, "must be in 0..65535", "TORCHELASTIC_HEALTH_CHECK_PORT")
        if timeout <= 0:
            raise ConfigError("timeout", timeout, "must be > 0")
        self._alive_callback = alive_callback
        self._port = int(port)
        self._timeout = timeout
        self._host = host
        self._clock = clock
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.error: OSError | None = None  # why start() could not listen, if it could not

    @property
    def port(self) -> int:
        """The bound port (useful when constructed with port 0)."""
        return self._server.server_address[1] if self._server else self._port

    def status(self) -> tuple[bool, float]:
        """(healthy, seconds since the agent's last progress)."""
        age = self._clock() - self._alive_callback()
        return age < self._timeout, age

    def start(self) -> None:
        # imported here, not at the top: http.server pulls in http.client, email and ssl,
        # ~20 ms of every agent's start (x32 nodes in a simulated cluster) for a server
        # most agents never start
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                healthy, age = owner.status()
                body = json.dumps({"healthy": healthy, "seconds_since_progress": round(age, 3),
                                   "timeout": owner._timeout}).encode()
                self.send_response(200 if healthy else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        try:
            self._server = ThreadingHTTPServer((self._host, self._port), Handler)
        except OSError as e:
            self.error = e
            log.warning("health check: cannot listen on %s:%d (%s); running without a health "
                        "check server (set TORCHELASTIC_HEALTH_CHECK_PORT to a free port)",
                        self._host, self._port, e.strerror or e)
            return
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="elastic-health",
                                        kwargs={"poll_interval": 0.2}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


def create_healthcheck_server(alive_callback: Callable[[], float], port: int,
                              timeout: float) -> HealthCheckServer:
    return HealthCheckServer(alive_callback, port, timeout)
