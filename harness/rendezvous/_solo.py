"""A rendezvous for a job of exactly one node: no rendezvous store, no torch import.

Used for ``--standalone``, ``c10d`` with ``--nnodes=1`` and single-node ``static``.
Every round gets a fresh workers' store, so a restarted attempt can never read the
previous attempt's keys (torch's shared agent store does: pytorch#135712):

* agent store (``static`` always, ``c10d`` unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``,
  as torch): this process hosts a new ``StoreServer`` each round (see ``_agent_store``),
  on ``--master-port`` or a free port; ``next_rendezvous()`` returns a client to it.
* otherwise workers' rank 0 hosts it on a port reserved afresh each round.

The job's restart count is this node's: ``charge_restart()`` makes the next round count
one more (the same rule as the multi-node rounds, ``_round.RoundMachine.charge_failure``).
"""

from __future__ import annotations

from harness.endpoints import PortReservation, fqdn
from harness.rendezvous._agent_store import AgentStore
from harness.rendezvous._api import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
)
from harness.rendezvous._store import StoreClient

__all__ = ["SoloRendezvousHandler"]


class SoloRendezvousHandler(RendezvousHandler):
    """Every round completes at once with this node as rank 0 of 1."""

    def __init__(self, params: RendezvousParameters, backend_name: str,
                 master_addr: str | None = None, master_port: int | None = None,
                 use_agent_store: bool = True):
        self._params = params
        self._backend_name = backend_name
        self._fixed_addr = master_addr
        self._fixed_port = master_port
        self._use_agent_store = use_agent_store
        self._closed = False
        self._round = -1
        self._restarts = 0  # the count of the round this node runs
        self._owed = 0  # the least count the next round carries
        self._reservation: PortReservation | None = None
        self._agent_store = AgentStore()
        self._client: StoreClient | None = None

    def get_backend(self) -> str:
        return self._backend_name

    @property
    def use_agent_store(self) -> bool:
        return self._use_agent_store

    def next_rendezvous(self) -> RendezvousInfo:
        if self._closed:
            raise RendezvousClosedError(f"rendezvous {self._params.run_id!r} is closed")
        self._release()
        self._round += 1
        self._restarts = max(self._restarts, self._owed)
        addr = self._fixed_addr or self._params.local_addr or fqdn()
        port = self._fixed_port
        if self._use_agent_store:
            port = self._agent_store.host(port or 0)
            self._client = StoreClient("127.0.0.1", port)
        elif port is None:
            self._reservation = PortReservation()
            port = self._reservation.port
        return RendezvousInfo(
            store=self._client,
            rank=0,
            world_size=1,
            bootstrap_store_info=RendezvousStoreInfo(addr, port, self._use_agent_store),
            round=self._round, restart_count=self._restarts,
        )

    def charge_restart(self) -> None:
        self._owed = max(self._owed, self._restarts + 1)

    def is_closed(self) -> bool:
        return self._closed

    def set_closed(self) -> None:
        self._closed = True

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self._params.run_id

    def shutdown(self) -> bool:
        self._release()
        self._closed = True
        return True

    def _release(self) -> None:
        """Drop the last round's store (its workers are gone by now) or port."""
        if self._client is not None:
            self._client.close()
            self._client = None
        self._agent_store.stop()
        if self._reservation is not None:
            self._reservation.release()
            self._reservation = None
