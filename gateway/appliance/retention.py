"""Edge retention: observations older than the configured age, or beyond the configured count per
sensor and property, are pruned from the store (the cloud keeps them, issue 7).

A client of the in-process transport like every agent of the gateway. Each run *finds* what is
beyond the retention with read-only queries on the query pool (gateway.observations.pruning:
the join over the whole observations graph runs there, without the GIL, instead of holding the
update thread), then *deletes* those observations by IRI in small updates through the normal
update path, so subscriptions see every deletion. Each delete update is awaited before the next
is queued: readings queued meanwhile go first, and wait behind at most one small delete.

Nothing is kept between runs: every run derives its work from the store (sequence numbers in
the latest nodes, result times), so a restart, a failed run or a race with the adapters leaves
nothing behind for good; the next run finds it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from gateway.appliance.config import ObservationsConfig
from gateway.client import SepaClient, SepaClientError
from gateway.observations.pruning import (
    MAX_SEQUENCE_QUERY,
    age_candidates_query,
    count_candidates_query,
    delete_update,
)

log = logging.getLogger(__name__)

# Candidates one find returns at most: bounds the rows converted to Python (which holds the GIL,
# ~2 us a row). A count find costs one pass over the observations whatever it returns (~0.15 s of
# query-pool CPU at 22k observations, measured), so one find should carry a whole run's work.
FIND_LIMIT = 5000
# Observations deleted by one update. Each costs ~0.1 ms of update thread (11 quads, all of it
# per-quad delta work), and a reading batch queued behind a delete waits for all of it: the chunk
# size is the tail of the notification latency while pruning runs. Measured with `sepa-gateway
# bench mqtt` (pruning every 2 s at 1,000 readings/s, quiet machine, 3 runs each): chunks of 100
# gave NL p99 39-62 ms, chunks of 25 gave 18-22 ms, and pruning kept up just the same (the store
# ended the phase at 20.4k-22.0k observations against 20.7k-22.0k; steady state 20k).
DELETE_CHUNK = 25


class Retention:
    def __init__(self, client: SepaClient, config: ObservationsConfig) -> None:
        self.client = client
        self.config = config
        self.pruned = 0  # quads removed since start
        self.runs = 0
        self.finds = 0
        self.deletes = 0
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
        """One pruning run, until nothing is beyond the retention; returns the quads removed."""
        removed = 0
        if await self._max_sequence() > self.config.retain_count:
            removed += await self._drain(count_candidates_query(self.config.retain_count, limit=FIND_LIMIT))
        removed += await self._drain(age_candidates_query(self.config.retain_age_s, limit=FIND_LIMIT))
        self.runs += 1
        return removed

    def metrics(self) -> dict[str, Any]:
        """Counters for /metrics."""
        return {
            "runs": self.runs,
            "pruned_quads": self.pruned,
            "finds": self.finds,
            "deletes": self.deletes,
        }

    async def _max_sequence(self) -> int:
        """The highest sequence number of any latest node: no observation can be beyond the count
        retention while it is at most retain_count, and then the join is not worth running."""
        result = await self.client.query(MAX_SEQUENCE_QUERY)
        value = result.rows[0][0] if result.rows else None
        try:
            return int(value.value) if value is not None else 0
        except ValueError:
            return 0

    async def _drain(self, find: str) -> int:
        """Find and delete until a find comes back short (all found) or deletes nothing."""
        removed = 0
        while True:
            rows = (await self.client.query(find)).rows
            self.finds += 1
            step = 0
            for start in range(0, len(rows), DELETE_CHUNK):
                # each observation with its result node (the find's second column, None for none)
                chunk = rows[start : start + DELETE_CHUNK]
                text = delete_update(term for row in chunk for term in row if term is not None)
                if text is not None:
                    deleted = (await self.client.update(text)).removed
                    self.deletes += 1
                    self.pruned += deleted
                    step += deleted
            removed += step
            if len(rows) < FIND_LIMIT or step == 0:
                return removed

    async def _run(self) -> None:
        """A run every prune_interval_s, start to start: a run's own duration (which grows with the
        readings since the last one) must not stretch the period, or pruning falls behind."""
        loop = asyncio.get_running_loop()
        due = loop.time() + self.config.prune_interval_s
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            due = max(due + self.config.prune_interval_s, loop.time())
            try:
                await self.prune()
            except SepaClientError as error:
                log.warning("retention: pruning failed", extra={"error": error.error_description})
