"""A rendezvous for a job of exactly one node: no store, no network, no torch import.

Used for ``--standalone``, ``c10d`` with ``--nnodes=1`` and single-node ``static``.
Workers' rank 0 hosts the torch.distributed store on a port reserved afresh for every
round, so a restarted attempt can never read the previous attempt's keys
(torch's shared agent store does: pytorch#135712).
"""

from __future__ import annotations

from harness.net import PortReservation, fqdn
from harness.rendezvous._api import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
)

__all__ = ["SoloRendezvousHandler"]


class SoloRendezvousHandler(RendezvousHandler):
    """Every round completes at once with this node as rank 0 of 1."""

    def __init__(self, params: RendezvousParameters, backend_name: str,
                 master_addr: str | None = None, master_port: int | None = None):
        self._params = params
        self._backend_name = backend_name
        self._fixed_addr = master_addr
        self._fixed_port = master_port
        self._closed = False
        self._round = -1
        self._reservation: PortReservation | None = None

    def get_backend(self) -> str:
        return self._backend_name

    def next_rendezvous(self) -> RendezvousInfo:
        if self._closed:
            raise RendezvousClosedError(f"rendezvous {self._params.run_id!r} is closed")
        self._round += 1
        addr = self._fixed_addr or self._params.local_addr or fqdn()
        port = self._fixed_port
        if port is None:
            self._release()
            self._reservation = PortReservation()
            port = self._reservation.port
        return RendezvousInfo(
            store=None,
            rank=0,
            world_size=1,
            bootstrap_store_info=RendezvousStoreInfo(addr, port, use_agent_store=False),
            round=self._round,
        )

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
        if self._reservation is not None:
            self._reservation.release()
            self._reservation = None
