"""Edge retention: observations older than the configured age, or beyond the configured count per
sensor and property, are pruned from the store (the cloud keeps them, issue 7).

A client of the in-process transport like every agent of the gateway. Each run *finds* what is
beyond the retention with read-only queries on the query pool (gateway.observations.pruning:
the join over the whole observations graph runs there, without the GIL, instead of holding the
update thread), then *deletes* those observations by IRI in small updates through the normal
update path, so subscriptions see every deletion. Each delete update is awaited before the next
is queued: readings queued meanwhile go first, and wait behind at most one small delete. Last,
it deletes the latest nodes silent for longer than the age retention, through the adapters' one
writer so that its mirror follows (gateway.observations.pruning says why).

Nothing is kept between runs: every run derives its work from the store (sequence numbers in
the latest nodes, result times), so a restart, a failed run or a race with the adapters leaves
nothing behind for good; the next run finds it again.

A forward step of the wall clock adds its size to the age, for `retain_age_s` after it (see
:meth:`Retention._age_s`): the observations stored before it carry the old clock's times.

A failed run, whatever the error, is logged, counted (`failures` on /metrics) and followed by the
next one on time. Retention is what bounds the store: when an unexpected error (a SystemError
raised inside a query's row conversion, seen once in `bench soak`) ended the task, nothing was
pruned again, and the gateway's RSS went from 300 MB to 1 GB in two minutes at 1,000 readings/s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from broker.api import clock_offset_us
from gateway.appliance.config import ObservationsConfig
from gateway.client import SepaClient, SepaClientError
from gateway.observations.pruning import (
    MAX_SEQUENCE_QUERY,
    age_candidates_query,
    count_candidates_query,
    delete_update,
    evict_update,
    silent_latest_query,
)
from gateway.observations.writer import ObservationWriter

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
# Under a load the update thread does not keep up with (a slower board, a burst), each delete waits
# a whole turn of the update queue, behind reading batches of up to 500: 25 observations a turn
# fall behind 1,000 readings/s (measured, bench soak on a 2-core machine about half as fast as the
# one above: the observations graph grew to 1.3 million quads in three minutes, the RSS from 270 to
# 850 MB). So a run still deleting when the next one is due doubles its chunk, up to the size of
# the MQTT adapter's largest batch; a run that ends in time halves it back toward DELETE_CHUNK.
CATCH_UP_CHUNK = 500
# A periodic run spreads its deletes over this share of the interval (a direct `prune()` call does
# not wait). Back to back, a run's deletes kept the update thread busy for a burst: with `bench
# coap` pruning every 2 s at 1,000 readings/s, the notification latency rose after every run, as
# the readings queued meanwhile took a while to drain (the gateway near one core busy). Measured,
# the 2-core test machine, 4 runs alternated with the build before, 2026-11-27: NL p99 26-39 ms
# against 42-52 ms. A run that falls behind stops pausing.
PACED_SHARE = 0.5
# a change of the wall clock against the steady clock larger than this between two runs is a step
# (NTP's slewing moves it by 30 ms a minute at most)
STEP_S = 1.0


class Retention:
    def __init__(
        self,
        client: SepaClient,
        config: ObservationsConfig,
        *,
        hold: Callable[[], bool] | None = None,
        writer: ObservationWriter | None = None,
    ) -> None:
        """`hold`: whether the store alone holds observations not shipped yet (the shipper's spool
        failed: its disk full). Retention then holds off, until the newest sensor's sequence has
        gone another `retain_count` (the store at most twice its size for that sensor). Why: the
        shipper spools what it missed from the store once it can, and retention had pruned them
        meanwhile: a 4 MB spool disk full for 40 s with retain_count 30 at 10 Hz lost 475 of 992
        readings, uncounted (/tmp/atk-dash/t5b_prune.py); now what it prunes past the hold is lost
        and counted (`sepa_shipper_lost_observations`).

        `writer`: the adapters' one writer, through which silent latest nodes are deleted so that its
        mirror follows (gateway.observations.writer); without one, they are deleted directly."""
        self.client = client
        self.writer = writer
        self.config = config
        self.hold = hold
        self.held_runs = 0  # runs skipped while the shipper could not spool
        self._held_from: int | None = None  # the newest sequence when the hold began
        self.pruned = 0  # quads removed since start
        self.runs = 0
        self.finds = 0
        self.deletes = 0
        self.failures = 0  # runs ended by an error (the next one runs on time all the same)
        self.chunk = DELETE_CHUNK  # observations per delete update (see CATCH_UP_CHUNK)
        self._late_at = 0.0  # when the run under way is late (the next one is due)
        self._paced = False  # the run under way spreads its deletes (see PACED_SHARE)
        self._task: asyncio.Task[None] | None = None
        self._offset = clock_offset_us()  # the wall clock less the steady one at the last run
        self._steps: list[tuple[float, float]] = []  # (time.monotonic(), seconds) of forward steps

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="retention")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def prune(self, *, paced: bool = False) -> int:
        """One pruning run, until nothing is beyond the retention; returns the quads removed.
        `paced`: its deletes spread over PACED_SHARE of the interval (the periodic runs)."""
        loop = asyncio.get_running_loop()
        self._late_at = loop.time() + self.config.prune_interval_s
        self._paced = paced
        chunk = self.chunk
        removed = 0
        newest = await self._max_sequence()
        if self.hold is not None and self.hold():
            if self._held_from is None:
                self._held_from = newest
            if newest - self._held_from < self.config.retain_count:
                self.held_runs += 1
                return 0
            log.warning("retention: pruning though the shipper could not spool: observations may be lost")
        else:
            self._held_from = None
        if newest > self.config.retain_count:
            removed += await self._drain(count_candidates_query(self.config.retain_count, limit=FIND_LIMIT))
        age_s = self._age_s()
        removed += await self._drain(age_candidates_query(age_s, limit=FIND_LIMIT))
        removed += await self._drain(
            silent_latest_query(age_s, limit=FIND_LIMIT),
            lambda rows: evict_update((row[0] for row in rows), age_s),
            self._update if self.writer is None else self.writer.evict,
        )
        self.runs += 1
        if self.chunk == chunk and loop.time() < self._late_at:
            self.chunk = max(DELETE_CHUNK, self.chunk // 2)
        return removed

    def _age_s(self) -> float:
        """The age past which observations and silent latest nodes go: `retain_age_s`, plus each
        forward step of the wall clock seen less than `retain_age_s` ago.

        Why: a Raspberry Pi boots at fake-hwclock's last save, NTP then steps its clock forward, and
        the observations stored before the step carry the old clock's times. Under libfaketime,
        a gateway whose clock stepped +30 days deleted the 5 observations and the 5 latest nodes
        stored in the 5 s before the step at its next run, all younger than a minute. Their true age
        is their apparent age less the step; once `retain_age_s` has passed since it, they are past
        the age anyway. A step back is not subtracted: what it leaves in the future is kept longer
        (`retain_count` still bounds it) rather than delete what is younger than the age."""
        offset = clock_offset_us()
        step_s = (offset - self._offset) / 1e6
        self._offset = offset
        now = time.monotonic()
        if step_s > STEP_S:
            self._steps.append((now, step_s))
            log.warning(
                "retention: wall clock stepped forward, the age counts from before it", extra={"step_s": step_s}
            )
        self._steps = [(at, size) for at, size in self._steps if now - at < self.config.retain_age_s]
        return self.config.retain_age_s + sum(size for _, size in self._steps)

    def metrics(self) -> dict[str, Any]:
        """Counters for /metrics."""
        return {
            "runs": self.runs,
            "pruned_quads": self.pruned,
            "finds": self.finds,
            "deletes": self.deletes,
            "failures": self.failures,
            "delete_chunk": self.chunk,
            "held_runs": self.held_runs,
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

    async def _update(self, text: str) -> int:
        return (await self.client.update(text)).removed

    async def _drain(
        self,
        find: str,
        build: Callable[[Sequence[Sequence[Any]]], str | None] | None = None,
        send: Callable[[str], Awaitable[int]] | None = None,
    ) -> int:
        """Find and delete until a find comes back short (all found) or deletes nothing. `build` makes
        the deletion of some rows of the find (default: observations and their result nodes, the
        find's two columns), `send` runs it and returns the quads removed (default: the client)."""
        removed = 0
        while True:
            rows = (await self.client.query(find)).rows
            self.finds += 1
            step, start = 0, 0
            while start < len(rows):
                # each observation with its result node (the find's second column, None for none)
                chunk = rows[start : start + self.chunk]
                start += len(chunk)
                text = (
                    delete_update(term for row in chunk for term in row if term is not None)
                    if build is None
                    else build(chunk)
                )
                began = asyncio.get_running_loop().time()
                if text is not None:
                    deleted = await (send or self._update)(text)
                    self.deletes += 1
                    self.pruned += deleted
                    step += deleted
                loop = asyncio.get_running_loop()
                if loop.time() >= self._late_at:  # behind: larger deletes, fewer turns
                    self.chunk = min(CATCH_UP_CHUNK, self.chunk * 2)
                    self._late_at = loop.time() + self.config.prune_interval_s
                    self._paced = False  # the rest of the run goes as fast as it can
                elif self._paced and (start < len(rows) or len(rows) == FIND_LIMIT):
                    await self._pause(len(rows) - start, loop.time() - began)
            removed += step
            if len(rows) < FIND_LIMIT or step == 0:
                return removed

    async def _pause(self, left: int, took: float) -> None:
        """Wait so that the `left` candidates of this find are deleted by PACED_SHARE into the
        interval, and at least as long as the last delete took: a find holds FIND_LIMIT candidates
        at most, so a run does not know how many follow (at 1,000 readings/s and the default
        60 s, twelve finds), and however many, retention then takes at most half the update path."""
        loop = asyncio.get_running_loop()
        paced_until = self._late_at - (1.0 - PACED_SHARE) * self.config.prune_interval_s
        spread = (paced_until - loop.time()) / -(-left // self.chunk) if left else 0.0
        await asyncio.sleep(max(spread, took))

    async def _run(self) -> None:
        """A run every prune_interval_s, start to start: a run's own duration (which grows with the
        readings since the last one) must not stretch the period, or pruning falls behind."""
        loop = asyncio.get_running_loop()
        due = loop.time() + self.config.prune_interval_s
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            due = max(due + self.config.prune_interval_s, loop.time())
            try:
                await self.prune(paced=True)
            except SepaClientError as error:
                self.failures += 1
                log.warning("retention: pruning failed", extra={"error": error.error_description})
            except Exception:  # noqa: BLE001 - the store's bound must outlive any one failure
                self.failures += 1
                log.exception("retention: pruning failed")
