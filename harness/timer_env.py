"""The two environment variables of torch's file timer contract, defined once.

A leaf module (importing it loads nothing): the agent sets them (``harness.agent``, which
imports the timer package only when a job asks for the watchdog) and the timer reads them
(``harness.timer``); both import the names from here.
"""

__all__ = ["ENABLE_FILE_TIMER_ENV", "TIMER_FILE_ENV"]

#: "1": the agent runs a file timer server for its workers (torch's agent reads the same)
ENABLE_FILE_TIMER_ENV = "TORCHELASTIC_ENABLE_FILE_TIMER"
#: the FIFO path of the agent's file timer server, exported to every worker
TIMER_FILE_ENV = "TORCHELASTIC_TIMER_FILE"
