"""``SimpleElasticAgent``'s control loop wired to a scripted rendezvous and scripted
workers: what it does on each decision (restart, re-form, fence, give up), without a
process or a socket. The decisions themselves are in ``test_agent_decide.py``."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from harness.agent import RunResult, WorkerSpec, WorkerState
from harness.agent._simple import SETTLED_WAIT, SimpleElasticAgent
from harness.rendezvous import RendezvousInfo, RendezvousRoundAbandonedError, RendezvousStoreInfo

S = WorkerState


class Handler:
    """The rendezvous as the agent sees it; the test flips ``changed`` and ``fenced``."""

    def __init__(self, unfence_after: int = 0):
        self.rounds = 0
        self.changed = False
        self.fenced: str | None = None
        self.unfence_after = unfence_after  # wait_unfenced calls that time out first
        self.waits = 0
        self.confirms: list[bool] = []  # membership_changed's ``confirm`` per call

    def get_run_id(self) -> str:
        return "loop"

    def next_rendezvous(self) -> RendezvousInfo:
        assert self.fenced is None, "rendezvous while fenced"
        self.rounds += 1
        self.changed = False
        return RendezvousInfo(store=None, rank=0, world_size=1,
                              bootstrap_store_info=RendezvousStoreInfo("h", 1), round=self.rounds)

    def membership_changed(self, confirm: bool = False) -> bool:
        self.confirms.append(confirm)
        return self.changed

    def fence_reason(self) -> str | None:
        return self.fenced

    def wait_unfenced(self, timeout: float) -> bool:
        self.waits += 1
        if self.waits > self.unfence_after:
            self.fenced = None
        return self.fenced is None


class Events:
    enabled = True

    def __init__(self) -> None:
        self.kinds: list[str] = []

    def emit(self, kind: str, **fields: Any) -> None:
        self.kinds.append(kind)


Step = tuple[WorkerState, Callable[[Handler], None]]


def nothing(handler: Handler) -> None:
    pass


def fence(handler: Handler) -> None:
    handler.fenced = "fenced: no answer for 0.9s"


def change(handler: Handler) -> None:
    handler.changed = True


class ScriptedAgent(SimpleElasticAgent):
    """Workers whose state on each tick is scripted; every action is logged."""

    def __init__(self, handler: Handler, script: list[Step], max_restarts: int = 0):
        spec = WorkerSpec(role="r", local_world_size=1, rdzv_handler=handler,
                          entrypoint="python", max_restarts=max_restarts)
        self.events = Events()
        super().__init__(spec, events=self.events)
        self.handler = handler
        self.script = iter(script)
        self.log: list[str] = []

    def _start_workers(self, worker_group: Any) -> dict[int, Any]:
        self.log.append(f"start@{self.handler.rounds}")
        return {0: 1}

    def _stop_workers(self, worker_group: Any) -> None:
        self.log.append("stop")

    def _monitor_workers(self, worker_group: Any) -> RunResult:
        state, effect = next(self.script)
        effect(self.handler)
        return RunResult(state)

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM) -> None:
        self.log.append("shutdown")

    def _wait_for_change(self, worker_group: Any, timeout: float) -> bool:
        return True


def test_fenced_agent_stops_workers_waits_then_rejoins_without_a_restart():
    handler = Handler(unfence_after=2)
    agent = ScriptedAgent(handler, [(S.HEALTHY, nothing), (S.HEALTHY, fence),
                                    (S.SUCCEEDED, nothing)])
    result = agent.run()
    assert result.state is S.SUCCEEDED
    assert agent.log == ["start@1", "stop", "start@2", "shutdown"]
    assert handler.waits == 3  # it waited (bounded slices) until the store answered
    assert agent.restart_count == 0
    kinds = agent.events.kinds
    assert kinds.index("fenced") < kinds.index("unfenced") < kinds.index("result")


def test_fence_wins_over_a_failure_and_a_membership_change():
    handler = Handler()

    def fail_everything(h: Handler) -> None:
        fence(h)
        change(h)

    agent = ScriptedAgent(handler, [(S.FAILED, fail_everything), (S.SUCCEEDED, nothing)],
                          max_restarts=1)
    assert agent.run().state is S.SUCCEEDED
    assert agent.restart_count == 0 and "membership_change" not in agent.events.kinds
    assert "fenced" in agent.events.kinds


class FencedWhileAsked(Handler):
    """A fence that begins while the membership check waits: the agent's workers failed
    (a peer's were stopped by its own fence), it asks for news newer than the failure, and
    the store stays silent until this node's keep-alive bound runs out too."""

    def membership_changed(self, confirm: bool = False) -> bool:
        self.confirms.append(confirm)
        fence(self)
        return True  # the keeper's reason: the fence


def test_a_fence_that_begins_during_the_membership_check_is_a_fence():
    """Seen once in the full suite (test_fencing's frozen store): the second agent's
    workers failed because the first's fence stopped theirs, and its check ended in its own
    fence, which it took for a membership change (no "fenced" on its timeline)."""
    handler = FencedWhileAsked()
    agent = ScriptedAgent(handler, [(S.FAILED, nothing), (S.SUCCEEDED, nothing)])
    assert agent.run().state is S.SUCCEEDED
    assert handler.confirms == [True]
    assert "fenced" in agent.events.kinds and "membership_change" not in agent.events.kinds
    assert agent.restart_count == 0


def test_failure_after_a_membership_change_reforms_without_a_restart():
    agent = ScriptedAgent(Handler(), [(S.FAILED, change), (S.SUCCEEDED, nothing)])
    assert agent.run().state is S.SUCCEEDED
    assert agent.log == ["start@1", "stop", "start@2", "shutdown"]
    assert agent.restart_count == 0 and "membership_change" in agent.events.kinds


def test_only_a_failure_asks_for_news_newer_than_itself():
    handler = Handler()
    agent = ScriptedAgent(handler, [(S.HEALTHY, nothing), (S.FAILED, nothing), (S.UNHEALTHY, nothing),
                                    (S.HEALTHY, nothing), (S.SUCCEEDED, nothing)], max_restarts=2)
    assert agent.run().state is S.SUCCEEDED
    assert handler.confirms == [False, True, True, False]


def test_failures_use_restarts_then_give_up():
    agent = ScriptedAgent(Handler(), [(S.FAILED, nothing), (S.FAILED, nothing)], max_restarts=1)
    assert agent.run().state is S.FAILED
    assert agent.log == ["start@1", "stop", "start@2", "stop", "shutdown"]
    assert agent.restart_count == 1


def test_healthy_ticks_do_nothing_until_success():
    agent = ScriptedAgent(Handler(), [(S.HEALTHY, nothing)] * 3 + [(S.SUCCEEDED, fence)])
    assert agent.run().state is S.SUCCEEDED  # success wins even when fenced at the end
    assert agent.log == ["start@1", "shutdown"]
    assert "fenced" not in agent.events.kinds


class QuietAgent(ScriptedAgent):
    """Waits scripted too: each wait says whether something woke it (a worker's exit, the
    rendezvous's news) or the interval passed with nothing new; it polls nothing else."""

    def __init__(self, handler: Handler, script: list[Step], wakes: list[bool]):
        super().__init__(handler, script)
        self.wakes = iter(wakes)
        self.looks = 0
        self.timeouts: list[float] = []

    def _wait_for_change(self, worker_group: Any, timeout: float) -> bool:
        self.timeouts.append(timeout)
        return next(self.wakes)

    def _polls_nothing(self) -> bool:
        return True

    def _monitor_workers(self, worker_group: Any) -> RunResult:
        self.looks += 1
        return super()._monitor_workers(worker_group)


def test_a_quiet_wait_after_a_healthy_look_looks_again_only_when_woken():
    handler = Handler()
    agent = QuietAgent(handler, [(S.HEALTHY, nothing), (S.HEALTHY, nothing), (S.SUCCEEDED, nothing)],
                       wakes=[False, False, False, True, False, True])
    assert agent.run().state is S.SUCCEEDED
    # the first look (nothing seen yet), then only at the two wakes: three quiet waits
    # skipped (a loop that looked at each would have succeeded at the third wait)
    assert agent.looks == 3 and len(agent.timeouts) == 6
    assert handler.confirms == [False, False]  # the rendezvous was asked at each look alone
    # it waits the monitor interval until a look found the workers healthy, then longer
    interval = agent.get_worker_group().spec.monitor_interval
    assert agent.timeouts == [interval, SETTLED_WAIT, SETTLED_WAIT, SETTLED_WAIT, SETTLED_WAIT, SETTLED_WAIT]


def test_an_agent_that_polls_looks_at_every_tick():
    handler = Handler()
    agent = ScriptedAgent(handler, [(S.HEALTHY, nothing)] * 3 + [(S.SUCCEEDED, nothing)])
    agent.run()
    assert handler.confirms == [False, False, False]  # ScriptedAgent cannot tell a quiet wait


def test_after_a_fence_the_next_tick_looks_quiet_or_not():
    handler = Handler()
    agent = QuietAgent(handler, [(S.HEALTHY, fence), (S.HEALTHY, nothing), (S.SUCCEEDED, nothing)],
                       wakes=[False, False, False, True])
    assert agent.run().state is S.SUCCEEDED
    # the fence (found by a healthy look) is acted on at once; the quiet wait after the
    # workers' restart follows no healthy look, so it looks
    assert agent.log == ["start@1", "stop", "start@2", "shutdown"]
    assert agent.looks == 3


def test_a_fence_begun_between_looks_ends_a_quiet_tick():
    handler = Handler()

    class FencedWhileQuiet(QuietAgent):
        def _wait_for_change(self, worker_group: Any, timeout: float) -> bool:
            woke = next(self.wakes)
            if self.looks == 1 and not woke:
                fence(handler)  # the keeper's lease ran out while the agent slept
            return woke

    agent = FencedWhileQuiet(handler, [(S.HEALTHY, nothing), (S.HEALTHY, nothing), (S.SUCCEEDED, nothing)],
                             wakes=[True, False, False, False])
    assert agent.run().state is S.SUCCEEDED
    assert agent.log == ["start@1", "stop", "start@2", "shutdown"]
    assert "fenced" in agent.events.kinds


class JobHandler(Handler):
    """A rendezvous that keeps the job's restart count, as ours do: ``counts`` says what
    each round carries (other nodes' failures included); ``charges`` counts the charges."""

    def __init__(self, counts: list[int]):
        super().__init__()
        self.counts = iter(counts)
        self.charges = 0

    def next_rendezvous(self) -> RendezvousInfo:
        info = super().next_rendezvous()
        info.restart_count = next(self.counts)
        return info

    def charge_restart(self) -> None:
        self.charges += 1


def test_the_budget_is_the_jobs_another_nodes_failure_uses_it():
    """Round 2 carries count 1: a failure elsewhere used the job's one restart, so this
    agent's first failure of its own ends the job (torch: it still had a budget)."""
    handler = JobHandler([0, 1])
    agent = ScriptedAgent(handler, [(S.HEALTHY, change), (S.FAILED, nothing)], max_restarts=1)
    assert agent.run().state is S.FAILED
    assert agent.log == ["start@1", "stop", "start@2", "stop", "shutdown"]
    assert agent.restart_count == 1 and handler.charges == 0


def test_only_a_failure_of_its_own_is_charged_to_the_job():
    handler = JobHandler([0, 0, 0, 1])
    agent = ScriptedAgent(handler, [(S.FAILED, change), (S.HEALTHY, fence), (S.FAILED, nothing),
                                    (S.SUCCEEDED, nothing)], max_restarts=3)
    assert agent.run().state is S.SUCCEEDED
    assert handler.charges == 1  # the re-form and the fence are no restarts
    assert agent.restart_count == 1  # the count the rendezvous gave the last round


def test_a_fresh_agent_starts_with_the_jobs_count():
    """pytorch#147064: an agent that (re)joins a job that used its restarts has none left."""
    agent = ScriptedAgent(JobHandler([2]), [(S.FAILED, nothing)], max_restarts=2)
    assert agent.run().state is S.FAILED
    assert agent.log == ["start@1", "stop", "shutdown"]


class AbandonedStore:
    """A round's store whose waits give up: a member was lost after the round completed and
    before its ranks were assigned (the round's ``RoundStore`` raises so)."""

    def set(self, key: str, value: bytes) -> None:
        pass

    def get(self, key: str) -> bytes:
        raise RendezvousRoundAbandonedError(f"gave up waiting for [{key!r}] in round 1: lost vm:42")


class LosesAMemberBeforeRanks(Handler):
    """Round 1 (world 2) loses a member before the ranks; round 2 is this node alone."""

    def next_rendezvous(self) -> RendezvousInfo:
        info = super().next_rendezvous()
        if self.rounds == 1:
            info.world_size, info.store = 2, AbandonedStore()
        return info


def test_a_round_abandoned_before_its_ranks_were_assigned_is_followed_by_the_next():
    """A 128-node job under load lost a member right after a round completed: every agent
    waiting for its ranks raised "gave up waiting", ended, and the first to end closed the
    rendezvous for the rest. The round is over, not the job: the agent joins the next,
    starting no worker for the abandoned one and charging no restart."""
    handler = LosesAMemberBeforeRanks()
    agent = ScriptedAgent(handler, [(S.SUCCEEDED, nothing)])
    assert agent.run().state is S.SUCCEEDED
    assert agent.log == ["start@2", "shutdown"]
    assert agent.restart_count == 0 and agent.events.kinds.count("membership_change") == 1
    assert agent.events.kinds.count("rendezvous") == 1  # the round it ran
