"""A standalone rendezvous store: ``python -m harness.rendezvous.store_server --port N``.

Hosts the TCPStore outside every node, so a job survives the loss of any node (the
agent that hosts the store in-process is otherwise the job's single point of failure).
Start the agents with ``--rdzv-conf is_host=false``. Prints ``PORT <n>`` on stdout once
it listens (``--port 0`` picks a free port without a probe-then-bind race), runs until
SIGTERM/SIGINT, and dies with its parent (PDEATHSIG) unless ``--detach`` is given.

With ``HARNESS_RDZV_SECRET`` (or ``HARNESS_RDZV_SECRET_FILE``) in its environment, it
serves only connections that prove they know that secret (``_store_auth``). It never
takes the secret as an argument, because every user of the host can read command lines.
It logs each refusal on stderr with the peer's address.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys

from harness.errors import ConfigError
from harness.rendezvous._store import DEFAULT_PORT, StoreServer
from harness.rendezvous._store_auth import job_secret

#: where the server writes, when it stops, how many requests of each command it served
#: (JSON: ``{"served": {"GET": n, ...}}``): what a rendezvous costs the store
STORE_STATS_ENV = "HARNESS_STORE_STATS"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.rendezvous.store_server",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="", help="address to bind (default: all)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (0: pick a free one)")
    parser.add_argument("--detach", action="store_true",
                        help="keep running when the parent process dies")
    args = parser.parse_args(argv)
    if not 0 <= args.port < 65536:
        print(f"store_server: error: port={args.port} must be in 0..65535", file=sys.stderr)
        return 2
    try:
        secret = job_secret(os.environ)
    except ConfigError as e:
        print(f"store_server: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="store_server: %(message)s")
    if not args.detach:
        from harness.procs._prctl import die_with_parent

        die_with_parent(os.getppid(), signal.SIGTERM)
    try:
        server = StoreServer(args.host, args.port, secret=secret)
    except OSError as e:
        print(f"store_server: error: cannot listen on port {args.port}: {e.strerror}", file=sys.stderr)
        return 1

    def stop(signum: int, frame: object) -> None:
        server.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"PORT {server.port}", flush=True)
    server.serve_forever()
    stats = os.environ.get(STORE_STATS_ENV)
    if stats:
        with open(stats, "w") as out:
            json.dump({"served": server.served()}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
