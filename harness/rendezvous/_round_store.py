"""``RoundStore``: the store as one rendezvous round's workers see it (keys under the
round's prefix; waits that give up when the round is abandoned)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import timedelta
from typing import Protocol

from harness.rendezvous._api import RendezvousRoundAbandonedError
from harness.rendezvous._store import StoreClient, StoreTimeoutError

__all__ = ["RoundStore"]


class RoundWatcher(Protocol):
    """What a ``RoundStore`` asks while it waits (the c10d handler answers)."""

    def round_abandoned(self, round_: int) -> str | None: ...


class RoundStore:
    """The store as one round sees it: keys live under ``.../r<round>/``, so a new round
    never reads an old round's rank assignments or exit-barrier counters, and blocking
    waits give up as soon as the round is abandoned (a participant died, the rendezvous
    closed) instead of sitting out their full timeout: ``RendezvousRoundAbandonedError``,
    on which the agent joins the next round (a closed rendezvous tells it so there)."""

    def __init__(self, client: StoreClient, prefix: str, handler: RoundWatcher,
                 round_: int, slice_s: float):
        self._client = client
        self._prefix = prefix
        self._handler = handler
        self._round = round_
        self._slice = max(slice_s * 2, 0.05)
        self.timeout = client.timeout

    def __repr__(self) -> str:
        return f"RoundStore({self._prefix!r} on {self._client.address})"

    def _k(self, key: str) -> str:
        return self._prefix + key

    def set_timeout(self, timeout: float | timedelta) -> None:
        self.timeout = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)

    def set(self, key: str, value: bytes | str) -> None:
        self._client.set(self._k(key), value)

    def add(self, key: str, amount: int) -> int:
        return self._client.add(self._k(key), amount)

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        return self._client.compare_set(self._k(key), expected, desired)

    def check(self, keys: list[str]) -> bool:
        return self._client.check([self._k(k) for k in keys])

    def delete_key(self, key: str) -> bool:
        return self._client.delete_key(self._k(key))

    def append(self, key: str, value: bytes | str) -> None:
        self._client.append(self._k(key), value)

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        self._client.multi_set([self._k(k) for k in keys], values)

    def num_keys(self) -> int:
        return self._client.num_keys()

    def wait(self, keys: Iterable[str], timeout: float | timedelta | None = None) -> None:
        keys = list(keys)
        total = self.timeout if timeout is None else (
            timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout))
        deadline = time.monotonic() + total
        full = [self._k(k) for k in keys]
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StoreTimeoutError(f"rendezvous store {self._client.address}: wait for "
                                        f"{keys} in round {self._round} timed out after {total:g}s")
            try:
                self._client.wait(full, min(self._slice, remaining))
                return
            except StoreTimeoutError:
                pass
            reason = self._handler.round_abandoned(self._round)
            if reason is not None:
                raise RendezvousRoundAbandonedError(f"gave up waiting for {keys} in round {self._round}: {reason}")

    def get(self, key: str) -> bytes:
        return self.multi_get([key])[0]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """Wait for ``keys`` (giving up if the round is abandoned), then read them: they
        exist once the wait returned (a round's keys are not deleted), so they are read
        without the client's own wait, one round trip instead of two."""
        self.wait(keys)
        return self._client.peek_many([self._k(k) for k in keys])
