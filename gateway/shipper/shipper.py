"""The cloud shipper: a consumer on the client API that spools every new observation and uploads it.

Flow: a graph-feed subscription to the observations graph -> :func:`records.assemble` -> the spool
(one I/O thread: appends, seals, reads and deletes segment files; nothing blocks the event loop) ->
upload workers (``uploads_in_flight``) PUT sealed segments oldest first and delete them once
confirmed; failures back off exponentially with full jitter up to ``backoff_max_s``.

Exactly once, end to end: the spool's cursor (per sensor and property, the highest sequence number
spooled) filters the subscription's first result, which holds every observation in the store, so a
restart spools exactly what had not been spooled; a segment keeps its batch id across attempts and
the cloud answers a batch it already has idempotently; the Spark job drops repeated observation IRIs.
A marker in the store (`gw:spoolId` in the gateway's state graph) tells whether the store is the
one the cursor counted: a fresh store (or an in-memory one after a restart) resets the cursor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.api import Notification
from gateway.client import ClientSubscription, SepaClient, SepaClientError
from gateway.jsap.terms import quote
from gateway.observations.vocabulary import GRAPH_STATE, SHIPPER_NODE, SPOOL_ID
from gateway.shipper.contract import MAX_LINE_BYTES
from gateway.shipper.records import FEED_QUERY, assemble, json_line, key_of
from gateway.shipper.spool import Segment, Spool
from gateway.shipper.uploader import Uploader, UploadError

log = logging.getLogger(__name__)

RATE_WINDOW_S = 60.0
RESPOOL_INITIAL_S = 5.0  # after a failed append, the first try at spooling again (then doubling)
RESPOOL_MAX_S = 300.0
# Retried like any failure, but only the operator ends them: a token refused (revoked, expired, not
# bound to this gateway) or a URL the endpoint does not serve (see gateway.shipper.uploader)
OPERATOR_REASONS = frozenset({"http_401", "http_403", "http_404", "http_405"})


@dataclass(frozen=True)
class ShipperSettings:
    url: str
    token: str
    spool_dir: Path
    ca_file: str | None = None
    segment_max_bytes: int = 1 << 20
    segment_max_age_s: float = 10.0
    budget_bytes: int = 512 << 20
    upload_timeout_s: float = 30.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 300.0
    uploads_in_flight: int = 2

    def __repr__(self) -> str:  # the token never reaches a log line
        return f"ShipperSettings(url={self.url!r}, spool_dir={str(self.spool_dir)!r})"


class Shipper:
    def __init__(self, client: SepaClient, settings: ShipperSettings, gateway: str) -> None:
        self.client = client
        self.settings = settings
        self.gateway = gateway
        self.uploader = Uploader(
            settings.url, settings.token, ca_file=settings.ca_file, timeout_s=settings.upload_timeout_s
        )
        self.spool: Spool | None = None
        self.subscription: ClientSubscription | None = None
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shipper-io")
        self._sealed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._uploading: set[int] = set()
        self._uploads: deque[tuple[float, int]] = deque()  # (monotonic time, observations) for the rate
        self.failures = 0
        self.failures_by_reason: dict[str, int] = {}
        self.uploaded_observations = 0
        self.uploaded_segments = 0
        self.duplicate_segments = 0
        self.rejected_segments = 0
        self.incomplete_observations = 0
        self.digest_observations = 0  # of those spooled, how many came from a batch digest (the cheap path)
        self.last_success = 0.0  # wall clock, for /metrics
        self.last_success_steady = 0.0  # monotonic: how long ago, whatever steps the wall clock takes
        self._backoff = 0.0
        self.spool_failures = 0  # appends that failed (disk full...): spooled again from the store
        self._respool_at = 0.0  # when set (monotonic time), notifications are ignored until a resubscribe then
        self._respool_wait = 0.0
        # True from a failed append (or a spool that cannot be opened) until observations are spooled
        # again: the store alone holds what was not spooled, and retention holds off (see `holding`)
        self.holding = False
        self.lost_observations = 0  # found missing from the store when spooling resumed (pruned meanwhile)
        self.start_failures = 0  # starts that could not open the spool (disk full, no such directory)
        # The cloud's last answer when it was a refusal only the operator ends (OPERATOR_REASONS, or a
        # batch refused for good): /health fails meanwhile. Why not the backlog alone: a revoked token
        # kept /health "ok" until the spool was half full (days at the default budget), and batches
        # refused for good are set aside, so every observation went to spool/rejected/ (and, past the
        # budget, was deleted) with the backlog at 0 and /health "ok" throughout.
        self.refusal: str | None = None
        self._starting: asyncio.Task[None] | None = None

    async def _run_io(self, function: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._io, function, *args)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the spool, check the store marker, subscribe, and start sealing and uploading.

        A spool that cannot be opened (its disk full, its directory not creatable) is tried again,
        5 s later, then doubling up to 300 s, and the gateway runs meanwhile: before, the start
        failed with a traceback, and under systemd the whole gateway restarted every 2 s into the
        same failure, MQTT, CoAP and SPARQL down for an optional component. Retention holds off
        meanwhile (`holding`): the store alone has what is not spooled."""
        try:
            await self._start()
        except OSError as error:
            self.holding = True
            self.start_failures += 1
            log.error("shipper: cannot open the spool, trying again in %.0f s: %s", RESPOOL_INITIAL_S, error)
            self._starting = asyncio.get_running_loop().create_task(self._start_later(), name="shipper-start")

    async def _start_later(self) -> None:
        wait = RESPOOL_INITIAL_S
        while True:
            await asyncio.sleep(wait)
            try:
                await self._start()
                return
            except OSError as error:
                self.start_failures += 1
                wait = min(RESPOOL_MAX_S, wait * 2)
                log.error("shipper: cannot open the spool, trying again in %.0f s: %s", wait, error)

    async def _start(self) -> None:
        settings = self.settings
        self.spool = await self._run_io(
            lambda: Spool.open(
                settings.spool_dir, segment_max_bytes=settings.segment_max_bytes, budget_bytes=settings.budget_bytes
            )
        )
        if self.spool.sealed_count:
            self._sealed.set()
        await self._check_marker(self.spool)
        await self._subscribe()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._seal_by_age(), name="shipper-sealer")]
        self._tasks += [
            loop.create_task(self._upload_worker(), name=f"shipper-upload-{index}")
            for index in range(settings.uploads_in_flight)
        ]
        log.info(
            "shipper started",
            extra={"url": settings.url, "spool": str(settings.spool_dir), "backlog": self.spool.backlog_observations},
        )

    async def stop(self) -> None:
        """Stop uploading and seal the open segment; what is spooled stays on disk and goes at the next start."""
        if self._starting is not None:
            self._starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._starting
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.subscription is not None:
            with contextlib.suppress(SepaClientError):
                await self.client.unsubscribe(self.subscription)
            self.subscription = None
        if self.spool is not None:
            try:
                await self._run_io(self.spool.seal)  # so that the next start uploads it at once
            except OSError as error:
                log.error("shipper: cannot seal the open segment: %s", error)
            await self._run_io(self.spool.close)
        await self.uploader.close()
        self._io.shutdown(wait=True)

    async def _check_marker(self, spool: Spool) -> None:
        result = await self.client.query(
            f"SELECT ?id WHERE {{ GRAPH <{GRAPH_STATE}> {{ <{SHIPPER_NODE}> <{SPOOL_ID}> ?id }} }}"
        )
        marks = {row[0].value for row in result.rows if row[0] is not None}
        if marks == {spool.id}:
            return
        if spool.cursor:
            log.warning("shipper: the store is not the one the spool counted; shipping every observation it holds")
        await self._run_io(spool.reset_cursor)
        await self.client.update(
            f"DELETE {{ GRAPH <{GRAPH_STATE}> {{ <{SHIPPER_NODE}> <{SPOOL_ID}> ?old }} }} "
            f"INSERT {{ GRAPH <{GRAPH_STATE}> {{ <{SHIPPER_NODE}> <{SPOOL_ID}> {quote(spool.id)} }} }} "
            f"WHERE {{ OPTIONAL {{ GRAPH <{GRAPH_STATE}> {{ <{SHIPPER_NODE}> <{SPOOL_ID}> ?old }} }} }}"
        )

    # -- spooling ---------------------------------------------------------------------------------

    async def _subscribe(self) -> None:
        """Subscribe to the observations graph: the first result holds every observation in the
        store, of which the cursor lets through only those not spooled yet."""
        self.subscription = await self.client.subscribe(
            FEED_QUERY, "cloud-shipper", on_notification=self._on_notification, iterate=False, keep_view=False
        )

    async def _on_notification(self, notification: Notification) -> None:
        if not notification.added or self._respool_at:
            return  # removals are the edge's retention: the cloud keeps everything
        try:
            sealed = await self._run_io(self._spool_rows, notification.added)
        except OSError as error:
            # Why not go on with the next notification: its observations would move the cursor past
            # these, which would then never be shipped (a full spool disk lost 2,100 of 3,000, with a
            # traceback per notification). The store still has them: from now on nothing is spooled,
            # and a new subscription, once the disk may have room, spools what the cursor lacks.
            self.spool_failures += 1
            self.holding = True
            self._respool_wait = min(RESPOOL_MAX_S, max(RESPOOL_INITIAL_S, self._respool_wait * 2))
            self._respool_at = time.monotonic() + self._respool_wait
            log.error("shipper: cannot spool, trying again from the store in %.0f s: %s", self._respool_wait, error)
            return
        self._respool_wait = 0.0
        self.holding = False
        if sealed:
            self._sealed.set()

    async def _respool(self) -> None:
        """Subscribe again, so that the first result spools what the failed appends did not."""
        if self.subscription is not None:
            with contextlib.suppress(SepaClientError):
                await self.client.unsubscribe(self.subscription)
            self.subscription = None
        self._respool_at = 0.0  # only now: a notification of the old subscription would move the cursor
        try:
            await self._subscribe()
        except SepaClientError as error:
            self._respool_at = time.monotonic() + RESPOOL_INITIAL_S
            log.error("shipper: cannot subscribe again: %s", error)

    def _spool_rows(self, rows: Any) -> bool:
        """On the I/O thread: flatten, drop what the cursor says was spooled already, append."""
        spool = self.spool
        assert spool is not None
        assembled = assemble(rows, self.gateway)
        self.incomplete_observations += assembled.incomplete
        if assembled.from_digest:
            self.digest_observations += len(assembled.records)
        cursor = spool.cursor
        lines: list[bytes] = []
        keys: dict[str, int] = {}
        first: dict[str, int] = {}  # the lowest sequence number past the cursor, per key
        for record in assembled.records:
            key = key_of(record)
            sequence = record["sequence"]
            if sequence <= cursor.get(key, 0):
                continue
            if sequence < first.get(key, sequence + 1):
                first[key] = sequence
            line = json_line(record)
            if len(line) > MAX_LINE_BYTES:  # the landing would refuse the segment it is in
                self.incomplete_observations += 1
                continue
            lines.append(line)
            if sequence > keys.get(key, 0):
                keys[key] = sequence
        # the first result after a failure: what it lacks between the cursor and the store is lost
        lost = sum(low - cursor[key] - 1 for key, low in first.items() if cursor.get(key, 0) and low > cursor[key] + 1)
        sealed = spool.append(lines, keys)  # may move the cursor: `lost` is counted before
        if self.holding and lost:
            self.lost_observations += lost
            log.warning("shipper: observations pruned from the store before they could be spooled: %d", lost)
        return sealed

    async def _seal_by_age(self) -> None:
        spool = self.spool
        assert spool is not None
        period = min(1.0, self.settings.segment_max_age_s / 2)
        while True:
            await asyncio.sleep(period)
            try:
                if self._respool_at and time.monotonic() >= self._respool_at:
                    await self._respool()
                if await self._run_io(spool.seal_if_older, self.settings.segment_max_age_s):
                    self._sealed.set()
            except OSError as error:
                log.error("shipper: cannot seal a segment: %s", error)
            except Exception:  # noqa: BLE001 - sealing must outlive any one failure, or nothing ships
                log.exception("shipper: sealing failed")

    # -- uploading --------------------------------------------------------------------------------

    async def _upload_worker(self) -> None:
        spool = self.spool
        assert spool is not None
        while True:
            segment = await self._run_io(spool.oldest, frozenset(self._uploading))
            if segment is None:
                self._sealed.clear()
                await self._sealed.wait()
                continue
            if segment.number in self._uploading:  # another worker claimed it while this one awaited
                continue
            self._uploading.add(segment.number)
            try:
                await self._upload(spool, segment)
            except Exception as error:  # noqa: BLE001 - see below
                # A fault of this machine's (a segment that cannot be read, EIO; the spool's records
                # not written): before, it ended this worker, and with every worker gone nothing was
                # shipped again until a restart. Counted, retried after the upload backoff.
                self._count_failure("local")
                log.error("shipper: a segment could not be read or recorded, retrying: %r", error)
                await asyncio.sleep(self._retry_delay())
            finally:
                self._uploading.discard(segment.number)

    async def _upload(self, spool: Spool, segment: Segment) -> None:
        batch = spool.batch_id(segment, self.gateway)
        try:
            body = await self._run_io(spool.read, segment)
        except FileNotFoundError:  # dropped by the budget meanwhile
            await self._run_io(spool.confirmed, segment)
            return
        try:
            duplicate = await self.uploader.put(batch, body, segment.records)
        except UploadError as error:
            self._count_failure(error.reason)
            if not error.retry or error.reason in OPERATOR_REASONS:
                self.refusal = error.reason
            if not error.retry:
                self.rejected_segments += 1
                kept = await self._run_io(spool.reject, segment)
                log.error("shipper: the cloud refused a batch for good", extra={"batch": batch, "kept": str(kept)})
                log.error("shipper: refusal: %s", error)
                return
            delay = self._retry_delay()
            log.warning("shipper: upload failed, retrying in %.1f s: %s", delay, error)
            await asyncio.sleep(delay)
            return
        self._backoff = 0.0
        self.refusal = None
        await self._run_io(spool.confirmed, segment)
        now = time.monotonic()
        self.last_success = time.time()
        self.last_success_steady = now
        self.uploaded_segments += 1
        self.duplicate_segments += duplicate
        self.uploaded_observations += segment.records
        self._uploads.append((now, segment.records))

    def _count_failure(self, reason: str) -> None:
        self.failures += 1
        self.failures_by_reason[reason] = self.failures_by_reason.get(reason, 0) + 1

    def _retry_delay(self) -> float:
        """The next wait before a retry: exponential backoff with jitter."""
        self._backoff = min(self.settings.backoff_max_s, max(self.settings.backoff_initial_s, self._backoff * 2))
        return random.uniform(self.settings.backoff_initial_s / 2, self._backoff)  # noqa: S311 - jitter

    # -- observability ------------------------------------------------------------------------------

    def upload_rate(self) -> float:
        """Observations confirmed per second over the last minute."""
        now = time.monotonic()
        while self._uploads and self._uploads[0][0] < now - RATE_WINDOW_S:
            self._uploads.popleft()
        return sum(count for _, count in self._uploads) / RATE_WINDOW_S

    def metrics(self) -> dict[str, Any]:
        spool = self.spool
        numbers: dict[str, Any] = {
            "uploaded_observations": self.uploaded_observations,
            "uploaded_segments": self.uploaded_segments,
            "duplicate_segments": self.duplicate_segments,
            "upload_failures": self.failures,
            "rejected_segments": self.rejected_segments,
            "incomplete_observations": self.incomplete_observations,
            "spool_failures": self.spool_failures,
            "lost_observations": self.lost_observations,
            "holding": int(self.holding),
            "refusing": int(self.refusal is not None),
            "start_failures": self.start_failures,
            "digest_observations": self.digest_observations,
            "upload_rate_per_s": round(self.upload_rate(), 3),
            "last_success_timestamp": self.last_success,
            "seconds_since_success": round(time.monotonic() - self.last_success_steady, 1) if self.last_success else 0,
        }
        numbers.update({f"upload_failures_{reason}": count for reason, count in self.failures_by_reason.items()})
        if spool is not None:
            numbers.update(
                spooled_observations=spool.spooled,
                backlog_observations=spool.backlog_observations,
                backlog_segments=spool.sealed_count + (spool.open_records > 0),
                backlog_bytes=spool.backlog_bytes,
                dropped_observations=spool.dropped_observations,
                dropped_segments=spool.dropped_segments,
                rejected_bytes=spool.rejected_bytes,
                rejected_deleted_segments=spool.rejected_deleted,
                damaged_observations=spool.damaged_records,
                damaged_segments=spool.damaged_segments,
                damaged_files=spool.damaged_files,
            )
        return numbers
