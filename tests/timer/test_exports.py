"""The public surface of ``harness.timer`` is pinned: adding or removing a name is a decision."""

import harness.timer as timer

CONTRACT = {  # names users and tests rely on (torch's names)
    "configure", "expires", "TimerRequest", "TimerServer", "TimerClient", "LocalTimerServer",
    "LocalTimerClient", "FileTimerServer", "FileTimerClient", "log_debug_info_for_expired_timers",
}
EXTRAS = {  # ours: clocks, the request with a signal, reports, the agent's watchdog
    "AgentWatchdog", "Clock", "FakeClock", "FileTimerRequest", "MonotonicClock", "TimerExpiry",
    "TimerUnavailableError", "WorkerTimerExpired",
}


def test_exported_names_are_pinned():
    assert set(timer.__all__) == CONTRACT | EXTRAS
    for name in timer.__all__:
        assert getattr(timer, name).__module__.startswith("harness.timer")


def test_importing_timer_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, harness.timer; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
