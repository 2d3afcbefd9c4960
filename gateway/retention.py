"""Edge retention: observations older than the configured age, or beyond the configured count per
sensor and property, are pruned from the store (the cloud keeps them, issue 7).

A client of the in-process transport like every agent of the gateway; each run deletes at most a
bounded number of observations per update (`prune_update`'s limit) and repeats while it deletes,
so a large backlog is pruned in small steps that never hold the update thread for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gateway.client import SepaClient, SepaClientError
from gateway.config import ObservationsConfig
from gateway.observations import prune_update

log = logging.getLogger(__name__)

STEPS_PER_RUN = 50
# Observations deleted by one update at most. Measured (30k observations in store): a step costs
# ~0.4 s even when it deletes nothing, and 20,000 deletions took 8.3 s, all on the update thread;
# small steps let other updates through between them. Pruning needs a cheaper design (see notes).
STEP_LIMIT = 1000


class Retention:
    def __init__(self, client: SepaClient, config: ObservationsConfig) -> None:
        self.client = client
        self.config = config
        self.pruned = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="retention")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def prune(self) -> int:
        """One pruning run; returns the quads removed."""
        text = prune_update(self.config.retain_count, self.config.retain_age_s, limit=STEP_LIMIT)
        removed = 0
        for _ in range(STEPS_PER_RUN):
            summary = await self.client.update(text)
            removed += summary.removed
            if summary.removed == 0:
                break
        self.pruned += removed
        return removed

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.prune_interval_s)
            try:
                await self.prune()
            except SepaClientError as error:
                log.warning("retention: pruning failed", extra={"error": error.error_description})
