"""Batches received messages, commits each batch once, and only then acknowledges it to the broker.

The acknowledgement is the broker's licence to forget a message, so it follows the commit: a process killed
before a commit returns leaves its messages unacknowledged in the persistent session, and the broker redelivers
them. The only duplicates are messages committed whose acknowledgements had not reached the broker yet.

Batches form on their own under load: while one batch commits, the next accumulates, so a slow commit means
larger batches (one update for many readings) rather than a growing queue. Memory is bounded by the receive
window (`MqttSettings.receive_maximum`): the broker sends nothing more while that many messages are unacknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from adapters.mqtt.connection import Message, MqttConnection
from adapters.mqtt.settings import MqttSettings
from gateway.observations.counters import SourceCounters

log = logging.getLogger(__name__)

Commit = Callable[[list[Message]], Awaitable[None]]

COMMIT_RETRY_MIN_S = 0.1
COMMIT_RETRY_MAX_S = 5.0
FAILURE_LOG_INTERVAL_S = 30.0
# Longer topics are counted and dropped like oversize payloads. MQTT allows 65,535 bytes, and the mapper
# keeps what it learns per topic (its topic cache, 16,384 topics; Homie units, 65,536): 1,000 `$unit`
# messages on 60 KB topics grew the gateway by 172 MB in 2 s, ~11 GB at the units' bound, from one sensor
# login (its ACL grants homie/5/<login>/#). No convention comes near 256 bytes (AWS IoT allows no more; the
# ACL's topic patterns are 256 characters at most).
MAX_TOPIC_BYTES = 256
_SHOWN_TOPIC = 64  # a long topic is counted under its first characters, not kept whole


@dataclass
class IngestStats:
    """Counters for /metrics."""

    batches: int = 0
    committed: int = 0
    acked: int = 0
    commit_failures: int = 0
    dropped_oversize: int = 0
    dropped_long_topic: int = 0
    largest_batch: int = 0
    commit_seconds: float = 0.0


class Ingestor:
    """Takes messages from an `MqttConnection` in batches and hands them to `commit`, then acknowledges them.

    `commit(batch)` must make the whole batch durable or raise. Raising means "not committed": nothing of the
    batch is acknowledged and the same batch is retried with backoff until it commits (or the ingestor stops,
    leaving it to the broker to redeliver). So commit must raise only when the store could not take the batch;
    a payload it cannot read is its own business to count (`counters`) and skip, or ingestion stalls on it.
    """

    def __init__(
        self,
        connection: MqttConnection,
        commit: Commit,
        settings: MqttSettings | None = None,
        counters: SourceCounters | None = None,
    ) -> None:
        self.connection = connection
        self.settings = settings or connection.settings
        self.counters = counters or SourceCounters()
        self.stats = IngestStats()
        self._commit = commit
        self._stopping = asyncio.Event()
        self._committing = False
        self._task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Ingest until `stop`. A batch being collected when stopped is left unacknowledged (redelivered later)."""
        self._task = asyncio.current_task()
        try:
            while not self._stopping.is_set():
                batch = await self._collect()
                if not batch:
                    continue
                self._committing = True
                try:
                    if await self._commit_with_retry(batch):
                        self.stats.acked += self.connection.ack(batch)
                finally:
                    self._committing = False
        except asyncio.CancelledError:
            if not self._stopping.is_set():
                raise

    async def stop(self) -> None:
        """Stop after the commit in progress, if any, and its acknowledgements."""
        self._stopping.set()
        task = self._task
        if task is None or task is asyncio.current_task():
            return
        if not self._committing:
            task.cancel()
        await asyncio.wait({task})

    def metrics(self) -> dict[str, Any]:
        """Counters for /metrics, bad input per topic included."""
        return {
            **asdict(self.stats),
            "bad_input": self.counters.total,
            "bad_input_by_topic": dict(self.counters.counts),
        }

    async def _collect(self) -> list[Message]:
        """Up to batch_max messages: waits for the first, then up to batch_wait_ms for more, but not when the
        broker's window is full (nothing more can come until this batch is acknowledged)."""
        batch_max = self.settings.batch_max
        batch = await self.connection.receive(batch_max)
        if not batch:
            return batch
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.batch_wait_ms / 1000
        while len(batch) < batch_max and not self.connection.window_full:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            batch.extend(await self.connection.receive(batch_max - len(batch), remaining, fill=True))
        return batch

    async def _commit_with_retry(self, batch: list[Message]) -> bool:
        """Commit the batch's acceptable messages, retrying with backoff; False if stopped before it committed.

        Oversize payloads and topics over MAX_TOPIC_BYTES never reach commit: no retry could ever make them
        acceptable, so they are counted and acknowledged with the batch (dropped), keeping acknowledgements in
        arrival order as MQTT requires.
        """
        limit = self.settings.max_payload_bytes
        accepted: list[Message] = []
        for message in batch:
            if len(message.payload) > limit:
                self.stats.dropped_oversize += 1
                self.counters.add(
                    message.topic, f"payload of {len(message.payload)} bytes exceeds max_payload_bytes ({limit})"
                )
            elif len(message.topic) > MAX_TOPIC_BYTES // 4 and len(message.topic.encode()) > MAX_TOPIC_BYTES:
                self.stats.dropped_long_topic += 1
                self.counters.add(
                    message.topic[:_SHOWN_TOPIC] + "...",
                    f"topic of {len(message.topic.encode())} bytes exceeds {MAX_TOPIC_BYTES}",
                )
            else:
                accepted.append(message)
        if not accepted:
            return True
        delay = COMMIT_RETRY_MIN_S
        failures = 0
        logged_at = 0.0
        while True:
            started = time.perf_counter()
            try:
                await self._commit(accepted)
            except Exception as error:
                failures += 1
                self.stats.commit_failures += 1
                now = time.monotonic()
                if failures == 1:
                    log.error("mqtt: commit of %d messages failed; retrying", len(accepted), exc_info=True)
                    logged_at = now
                elif now - logged_at >= FAILURE_LOG_INTERVAL_S:
                    log.error("mqtt: commit still failing after %d attempts: %r", failures, error)
                    logged_at = now
                try:
                    async with asyncio.timeout(delay):
                        await self._stopping.wait()
                    log.warning("mqtt: stopped with %d uncommitted messages; the broker redelivers them", len(batch))
                    return False
                except TimeoutError:
                    delay = min(delay * 2, COMMIT_RETRY_MAX_S)
                    continue
            self.stats.commit_seconds += time.perf_counter() - started
            if failures:
                log.info("mqtt: commit succeeded after %d failed attempts", failures)
            self.stats.batches += 1
            self.stats.committed += len(accepted)
            self.stats.largest_batch = max(self.stats.largest_batch, len(accepted))
            return True
