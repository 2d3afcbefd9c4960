"""A log line a client off this board can cause with every request: written at most once a minute.

Why: a refusal logged once per request lets any host on the LAN write the log at its own pace. One
host sending refused registrations wrote a line (~250 B) each: 44,000 requests forced a rotation,
and the rotated files (60 MB) were all cycled in 4-5 minutes, the startup lines erased with them.
Each refusal is counted (the caller's metric, or :attr:`QuietLog.total`); the log gets one line a
minute at most, saying how many were refused since the last one (`refused`), which is what the
gates already did for refused connections and refused Host names (broker.gates.connections,
broker.gates.dispatch).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

LOG_EVERY_S = 60.0


class QuietLog:
    """`message` on `logger` at `level`, at most once per `every_s`, with the count since (`refused`)."""

    def __init__(
        self,
        logger: logging.Logger,
        message: str,
        *,
        level: int = logging.INFO,
        every_s: float = LOG_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.message = message
        self.level = level
        self.every_s = every_s
        self.clock = clock
        self.total = 0  # every occurrence since start
        self._unlogged = 0
        self._logged_at = float("-inf")

    def __call__(self, **extra: Any) -> None:
        """Count one occurrence; log it, with `extra` (the one that is logged) and the count since the
        last line, when the last line is `every_s` old."""
        since = self.due()
        if since is not None:
            self.logger.log(self.level, self.message, extra={**extra, "refused": since}, stacklevel=2)

    def due(self) -> int | None:
        """Count one occurrence; when a line is due, the occurrences since the last (this one
        included), else None. For a caller that writes the line itself (a logging filter)."""
        self.total += 1
        self._unlogged += 1
        now = self.clock()
        if now - self._logged_at < self.every_s:
            return None
        self._logged_at, since, self._unlogged = now, self._unlogged, 0
        return since
