"""A TCP forwarder: ``python tcp_proxy.py HOST PORT`` listens on a free loopback port
(printed as ``PORT n``) and relays every connection to HOST:PORT.

Tests put it between one agent and the rendezvous store and SIGSTOP it: that agent's
store traffic stops without a reset or FIN (as under a partition) while everything else,
its peers and their workers included, still talks. Dies with its parent.
"""

from __future__ import annotations

import selectors
import signal
import socket
import sys


def main() -> None:
    import os

    from harness.procs import die_with_parent

    die_with_parent(os.getppid(), signal.SIGTERM)
    target = (sys.argv[1], int(sys.argv[2]))
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    print(f"PORT {listener.getsockname()[1]}", flush=True)
    while True:
        for key, _ in sel.select():
            if key.data is None:
                client, _ = listener.accept()
                upstream = socket.create_connection(target)
                for a, b in ((client, upstream), (upstream, client)):
                    a.setblocking(False)
                    sel.register(a, selectors.EVENT_READ, b)
                continue
            src, dst = key.fileobj, key.data
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if data:
                dst.setblocking(True)
                dst.sendall(data)
                dst.setblocking(False)
                continue
            for s in (src, dst):
                try:
                    sel.unregister(s)
                except (KeyError, ValueError):
                    pass
                s.close()


if __name__ == "__main__":
    main()
