"""A port kept on a host for a job (the store node 0's agent hosts there: ``store_host="node0"``).

This machine keeps the store's port with ``PortReservation``: a socket bound with
SO_REUSEADDR and never listening, so no other process takes the port while the store that
binds it too (with SO_REUSEADDR) is not up. A host's port is kept the same way, by a keeper
started there under the connection's supervisor (``python -I -S``, stdlib only): it binds
a port of the host's address, says which, and holds it until it is released or the
connection ends, however it ends.
"""

from __future__ import annotations

from harness.hosts import HostError, SshHost

__all__ = ["HostPort"]

#: run on a host: keep a port of its address (argv 1) bound, not listening, until ended; print it
_KEEP_PORT = """
import signal, socket, sys
sock = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    sock.bind((sys.argv[1], 0))
except OSError as e:
    print(f"bind: {e.strerror or e}", flush=True)
    sys.exit(1)
print(sock.getsockname()[1], flush=True)
while True:
    signal.pause()
"""
#: how long the keeper may take to say its port (an interpreter's start, under load)
_SAID_S = 30.0


class HostPort:
    """A port of ``host``'s address kept for the job until ``release()`` (``what`` names
    it in the error a host that cannot keep one gives)."""

    def __init__(self, host: SshHost, what: str):
        spec = host.spec
        self._keeper = host.start([spec.python, "-I", "-S", "-c", _KEEP_PORT, spec.address])
        said = self._keeper.first_line(_SAID_S).strip()
        if not said.isdigit():
            self._keeper.close()
            raise HostError(f"host {spec.label}: no port could be kept at {spec.address} {what}: {said or 'no word'}")
        self.port = int(said)

    def release(self) -> None:
        self._keeper.close()
