"""Worker process control: start, watch, stop; redirects, tee and log prefixes."""

from harness.procs._context import START_METHODS, ProcessContext, RunProcsResult
from harness.procs._logs import LogsSpecs, render_prefix
from harness.procs._std import Std

__all__ = ["START_METHODS", "LogsSpecs", "ProcessContext", "RunProcsResult", "Std", "render_prefix"]
