"""The rendezvous state shared by every node of a job: validated JSON, never pickle.

torch keeps this state as a base64 pickle in an unauthenticated store and unpickles
whatever it reads, so anyone who can reach the port can run code in every agent. Ours is
plain JSON with a schema tag, a version and the run id; anything else found under the key
(torch's pickle, another job's state, garbage) is rejected with a ``RendezvousStateError``
that says where it was found and what to do.

Fields (one round at a time):
    seq           bumped on every write; the value is also the fencing token (writes are
                  ``compare_set`` against the exact bytes read) and names the wake-up key
    round         the round number; ``complete`` once its participants are fixed
    participants  node ids that joined this round, in rank order once complete
    expected      nodes the forming round waits for (survivors + waiting nodes of the
                  previous round); when all have joined the round completes without last call
    waiting       nodes that arrived after the round completed (a reason to re-rendezvous)
    cause         why this round began: start, join, leave, death, restart
    restarts      the job's restart count: worker failures charged so far (each round that
                  ended in one, counted once however many nodes saw it). Raised only while
                  a round forms, so a complete round's value is fixed: it is the
                  ``TORCHELASTIC_RESTART_COUNT`` every worker of that round sees, and a
                  node that joins later (a fresh agent included) reads it, never resets it
    closed        the job is over; ``close_reason`` says why
    nodes         node id -> {"name", "addr", "port", "live"} metadata; ``finished`` once
                  it closed the job after its workers succeeded; ``leaving`` (seconds: the
                  grace its agent takes to stop its workers) once it announced a graceful
                  leave and until it withdraws (``_round.leaving_state``); ``fences``: how
                  many times it had fenced when it joined (absent: none)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from harness.rendezvous._api import RendezvousStateError

__all__ = ["RendezvousState", "SCHEMA", "KIND", "StoreKeys", "Joining", "joining_line", "parse_joining"]

SCHEMA = 2  # 2: ``restarts`` (an agent of schema 1 would drop it, resetting the count)
KIND = "harness.rendezvous"
_CAUSES = {"start", "join", "leave", "death", "restart", "timeout"}
_MAX_NODES = 100_000
_MAX_LEAVING_GRACE = 86_400.0  # seconds; a day is no grace, it is a hang


@dataclass
class RendezvousState:
    run_id: str
    seq: int = 0
    round: int = 0
    complete: bool = False
    closed: bool = False
    close_reason: str = ""
    cause: str = "start"
    restarts: int = 0
    participants: list[str] = field(default_factory=list)
    expected: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> bytes:
        # The fields as they are, not ``dataclasses.asdict``: that deep-copies every leaf, and
        # every agent writes this O(N) document at each join (2.3 ms at 128 nodes; 0.24 ms without).
        body = {"kind": KIND, "schema": SCHEMA, **{f.name: getattr(self, f.name) for f in fields(self)}}
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes, run_id: str, where: str) -> RendezvousState:
        def bad(why: str) -> RendezvousStateError:
            return RendezvousStateError(
                f"the rendezvous state at {where} is not ours ({why}); is another job or "
                f"torchrun using rdzv id {run_id!r} on this store? Use a distinct --rdzv-id.")

        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise bad(f"not JSON: {raw[:40]!r}") from None
        if not isinstance(body, dict) or body.get("kind") != KIND:
            raise bad("no 'kind': 'harness.rendezvous' tag")
        if body.get("schema") != SCHEMA:
            raise bad(f"schema {body.get('schema')!r}, this agent speaks schema {SCHEMA}")
        if body.get("run_id") != run_id:
            raise bad(f"run id {body.get('run_id')!r}")
        try:
            state = cls(
                run_id=run_id,
                seq=_int(body["seq"]), round=_int(body["round"]),
                complete=_bool(body["complete"]), closed=_bool(body["closed"]),
                close_reason=_str(body["close_reason"]), cause=_str(body["cause"]),
                restarts=_int(body["restarts"]),
                participants=_ids(body["participants"]), expected=_ids(body["expected"]),
                waiting=_ids(body["waiting"]), nodes=_nodes(body["nodes"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise bad(f"field {e}") from None
        if state.cause not in _CAUSES:
            raise bad(f"unknown cause {state.cause!r}")
        return state

    def copy(self) -> RendezvousState:
        return RendezvousState(
            run_id=self.run_id, seq=self.seq, round=self.round, complete=self.complete,
            closed=self.closed, close_reason=self.close_reason, cause=self.cause,
            restarts=self.restarts, participants=list(self.participants), expected=list(self.expected),
            waiting=list(self.waiting), nodes={k: dict(v) for k, v in self.nodes.items()},
        )

    def closed_by_a_finished_node(self) -> bool:
        """Closed by a node whose workers succeeded (the job ended there normally), not by
        one that gave up."""
        return self.closed and any(meta.get("finished") is True for meta in self.nodes.values())

    def leaving(self, node: str) -> float | None:
        """The grace ``node`` announced when it began to leave; None if it did not."""
        grace = self.nodes.get(node, {}).get("leaving")
        return None if grace is None else float(grace)

    def fences(self, node: str) -> int:
        """How many times ``node`` had fenced when it joined (0 unless its record says)."""
        return int(self.nodes.get(node, {}).get("fences", 0))

    def name(self, node: str) -> str:
        return str(self.nodes.get(node, {}).get("name", node))


def _int(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"{v!r} is not a non-negative int")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{v!r} is not a bool")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str) or len(v) > 4096:
        raise ValueError(f"{v!r} is not a short string")
    return v


def _ids(v: Any) -> list[str]:
    if not isinstance(v, list) or len(v) > _MAX_NODES:
        raise ValueError("node list is not a list")
    for x in v:  # inline, not _str: three lists of up to N ids in every parse
        if not isinstance(x, str) or len(x) > 4096:
            raise ValueError(f"{x!r} is not a short string")
    return v


#: node records as last read and as validated (id -> both): consecutive states share all
#: but a few, and validating 128 of them field by field was most of a parse. Read and
#: written by any thread (single dict operations); emptied past ``_KEPT_RECORDS``
_kept_records: dict[str, tuple[Any, dict[str, Any]]] = {}
_KEPT_RECORDS = 4096


def _nodes(v: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(v, dict) or len(v) > _MAX_NODES:
        raise ValueError("nodes is not an object")
    out = {}
    kept_records = _kept_records
    for k, meta in v.items():
        kept = kept_records.get(k)
        if kept is not None and kept[0] == meta:  # the same record: validated before
            out[k] = dict(kept[1])
            continue
        clean = _node(k, meta)
        if len(kept_records) >= _KEPT_RECORDS:
            kept_records.clear()
        kept_records[_str(k)] = (meta, clean)
        out[k] = dict(clean)
    return out


def _node(k: Any, meta: Any) -> dict[str, Any]:
    """One node's record, validated field by field (what is not ours is dropped)."""
    if not isinstance(meta, dict):
        raise ValueError(f"node {k!r} metadata is not an object")
    clean: dict[str, Any] = {"name": _str(meta.get("name", k)), "addr": _str(meta.get("addr", "")),
                             "live": _str(meta.get("live", ""))}
    port = meta.get("port")
    if port is not None:
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"node {k!r} port {port!r}")
        clean["port"] = port
    fences = meta.get("fences")
    if fences is not None:  # the fences its lease key counted when it joined
        clean["fences"] = _int(fences)
    if meta.get("finished") is True:  # closed the rendezvous after its workers succeeded
        clean["finished"] = True
    leaving = meta.get("leaving")
    if leaving is not None:  # announced its leave: the grace its agent takes to stop workers
        if isinstance(leaving, bool) or not isinstance(leaving, (int, float)) \
                or not 0 <= leaving <= _MAX_LEAVING_GRACE:
            raise ValueError(f"node {k!r} leaving {leaving!r}")
        clean["leaving"] = float(leaving)
    return clean


@dataclass(frozen=True)
class StoreKeys:
    """Where one rendezvous (``run_id``) keeps its state in the store: every key under
    one prefix, so jobs sharing a store never meet. ``endpoint`` names the store in errors."""

    run_id: str
    endpoint: str

    @property
    def prefix(self) -> str:
        return f"harness/rdzv/{self.run_id}/"

    @property
    def state(self) -> str:
        """The state document (``RendezvousState``)."""
        return self.prefix + "state"

    def heartbeat(self, node: str) -> str:
        """``node``'s keep-alive counter."""
        return f"{self.prefix}hb/{node}"

    def lease(self, node: str) -> str:
        """``node``'s lease in seconds (ASCII): how long it may stay silent before it fences
        itself (``_liveness.KeepAliveLease``), then how many times it has fenced
        (``_liveness.lease_text``); set before it joins, so a peer's read of it never waits."""
        return f"{self.prefix}lease/{node}"

    def seq(self, seq: int) -> str:
        """Set once the state reaches ``seq``: waiters block on the next one."""
        return f"{self.prefix}seq/{seq}"

    def round(self, round_: int) -> str:
        """The prefix of round ``round_``'s own keys (rank assignment, exit barrier)."""
        return f"{self.prefix}r{round_}/"

    def joining(self, round_: int) -> str:
        """The nodes that asked to join round ``round_`` while it formed, one line each
        (``joining_line``), appended: whoever writes the state next takes them all in."""
        return f"{self.prefix}r{round_}/joining"

    def parse(self, raw: bytes) -> RendezvousState:
        """The state read under ``state``; raises ``RendezvousStateError`` if not ours."""
        return RendezvousState.from_json(raw, self.run_id, f"key {self.state!r} of store {self.endpoint}")


#: a node that asked to join a forming round: what it would have written for itself
#: (its record, and the least restart count it owes the round)
Joining = tuple[dict[str, Any], int]


def joining_line(node: str, meta: dict[str, Any], owed: int) -> bytes:
    """``node``'s line in a round's joining list (``StoreKeys.joining``)."""
    return json.dumps({"id": node, "meta": meta, "owed": owed}, separators=(",", ":")).encode() + b"\n"


def parse_joining(raw: bytes) -> dict[str, Joining]:
    """The nodes a joining list names, in the order they first asked; a node's last line
    stands. A line that is not ours (not JSON, a field of the wrong kind) is skipped: its
    writer, if it is a node of the job, still joins by writing the state itself."""
    out: dict[str, Joining] = {}
    for line in raw.split(b"\n"):
        if not line:
            continue
        try:
            body = json.loads(line.decode("utf-8"))
            node, owed = _str(body["id"]), _int(body["owed"])
            meta = _node(node, body["meta"])
        except (UnicodeDecodeError, ValueError, KeyError, TypeError):
            continue
        out[node] = (meta, owed)
    return out
