"""The workers' torch.distributed store, hosted by the agent: a fresh server every round.

Why the agent hosts it (``TORCHELASTIC_USE_AGENT_STORE=True``, as torch's agents do for
``static`` always and for ``c10d`` unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``): when
worker rank 0 hosts it instead, a group that exits without ``destroy_process_group()``
loses the server the moment rank 0's interpreter exits, while the other ranks' store
clients still talk to it, and they die with SIGABRT at exit. The agent outlives every
worker of its round.

Why a fresh server every round: workers with the agent store connect to
``MASTER_ADDR:MASTER_PORT`` with no per-attempt key prefix (torch's
``_create_c10d_store``; ``init_process_group`` adds only the fixed ``default_pg/``), so
one store shared across attempts hands a restarted attempt the previous attempt's keys
(pytorch#135712). Our server is our own pure-Python one: a new one per round starts with
no keys and no connections left over from the last attempt. No torch import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from harness.rendezvous._api import RendezvousConnectionError
from harness.rendezvous._store import StoreServer

__all__ = ["AgentStore", "DISABLE_SHARE_ENV", "agent_store_enabled"]

#: "1": the workers do not share the rendezvous's TCP store (torch's switch)
DISABLE_SHARE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def agent_store_enabled(env: Mapping[str, str] | None = None) -> bool:
    """torch's opt-out: ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` puts the store back in
    worker rank 0 (dynamic backends only; ``static`` always uses the agent's)."""
    return (os.environ if env is None else env).get(DISABLE_SHARE_ENV, "0") != "1"


class AgentStore:
    """At most one running ``StoreServer``; ``host()`` replaces it with a fresh one."""

    def __init__(self) -> None:
        self._server: StoreServer | None = None

    def __repr__(self) -> str:
        return f"AgentStore({self._server!r})"

    @property
    def port(self) -> int | None:
        return None if self._server is None else self._server.port

    def host(self, port: int = 0) -> int:
        """Stop the last round's server and listen on ``port`` (0: any free one) before
        returning, so workers started next find it; returns the port."""
        self.stop()
        try:
            self._server = StoreServer("", port).start()
        except OSError as e:
            raise RendezvousConnectionError(
                f"cannot host the workers' store on port {port}: {e.strerror or e} "
                "(is another job using that --master-port?)") from None
        return self._server.port

    def stop(self) -> None:
        """Close the server and every worker connection to it (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()
