"""Debug logging of expired timers, in torch's format (its log scrapers keep working)."""

from __future__ import annotations

import logging

__all__ = ["log_debug_info_for_expired_timers"]

log = logging.getLogger(__name__)


def log_debug_info_for_expired_timers(run_id: str, expired_timers: dict[int, list[str]]) -> None:
    """Log ``{pid: [request json, ...]}`` of the timers that just expired, if any."""
    if expired_timers:
        log.info("Timers expired for run:[%s] [%s].", run_id, expired_timers)
