"""Delayed updates: SPARQL updates that run at a given time (seed 001 §II-C/D, event negation).

A delayed update is checked (parsed, protocol graphs validated) and stored when it is scheduled,
so invalid SPARQL is refused then, not when due. A timer task on the event loop sleeps until the
earliest due time and hands due updates to the scheduler's serial queue, in due order and ahead
of requests still queued (their place in the order of updates is their due time): from then on an
update takes the same path as every other one (update processor, SPUs, notifications).

Exactly once: the pending row is deleted by the store's :class:`~broker.store.ApplyMark` callback,
in the same journalled step that puts the update's delta in the store; the tags a store recovers
from its journal after a kill are deleted at start-up. So a row still there at start-up is an
update that has not run, and a row that is gone has run (or was cancelled). Updates that fell due
while the gateway was down run at start-up, in due order.

Never early: the timer compares the wall clock (the engine clock's source) with the due time
before handing an update over, and the update thread checks again an update due at an instant
(`at`); the timer also wakes at least once a second, so a wall clock stepped by NTP (a Raspberry Pi
has no RTC) is noticed.

A step of the wall clock moves what was scheduled with `delay`: a length of time from when it was
asked, measured by the clock that steps do not move (CLOCK_BOOTTIME). Why: a Raspberry Pi boots at
fake-hwclock's last save or at 1970 and NTP then steps it forward by days or decades; every `delay`
update (event negation: "no reading for 3 periods") then ran within a second of the step (measured
under libfaketime, a step of +30 days: an update due in an hour ran 3 s later), and a step back
held them for as long as the step. The timer measures the wall clock against that clock each time
it wakes; past STEP_US apart from the last time, it moves every `delay` update by the step, in its
heap and in the table (`GET /scheduled` shows the new due time, a restart keeps it). An update
given `at` keeps its instant, and so does a `delay` update a previous run scheduled: its due time
was set on that run's clock, which NTP had set (a board off for ten days boots at fake-hwclock's
time, ten days behind: moved by NTP's step, an update due an hour after the shutdown ran ten days
late). A step while the gateway is down cannot be told from time passing.

Memory (a 1 GB board): the timer holds (due time, seq, id, owner) per pending update, and the
limits an entry per client and owner; the text and options stay in the table (`scheduled.sqlite3`),
read when the update falls due, and start-up reads the table without them (`timings`). Before,
the heap held each PendingUpdate whole, text included: measured 2026-12-06, a real gateway
(`run --data-dir`, `/tmp/atk-mem/m1_pending.py`: the table prefilled, RSS 3 s after /health) with
100,000 pending updates of 150 characters was RSS 86 -> 153 MB (+670 B an update), now
86 -> 121 MB (+350 B); tracemalloc of `start` over 100,000 rows of ~90 characters, 465 -> 225 B
an update. Up to max_pending_bytes (64 MB) of text no longer waits in memory.

Revoked tokens: a secure client's update keeps the `jti` and `iat` of the bearer token it was
scheduled with, and never runs once that token is revoked (RFC 7009, by its `jti` or by its
client's cut-off, broker.security.tokens). Before, a thief with a stolen token scheduled updates
that ran after the owner revoked it, until the operator reset the client. The secure gates drop
the token's pending updates (:meth:`DelayedUpdates.drop_revoked`) before they answer the revocation
200: dropped, not only refused when due, so that GET /scheduled stops listing them at once and
they hold no quota (when revocations were kept in memory only, a restart forgot them while the
table kept its rows; they are on disk now too, broker.security.revocations). A
revocation finds them by `jti` (the table's index; a cut-off, once per REVOKED_PER_CLIENT of a
client's revocations, looks at that client's tokens only), never by a scan of every pending update.
Two checks close what the drop alone leaves: an update scheduled with the token after the
revocation is refused (401) on the update thread, where the drop also runs, so none is stored
after it; and one handed over as it fell due is refused when it runs. Counted in
sepa_delayed_revoked_total, logged once a minute at most. A token's expiry drops nothing: an
update legitimately outlives its token's hour.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import sqlite3
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.core.access import GraphAccess
from broker.core.pending import PendingUpdate, PendingUpdates
from broker.errors import Forbidden, NotFound, SepaError, Unauthorized
from broker.quiet_log import QuietLog
from broker.store import ApplyMark

if TYPE_CHECKING:
    from broker.scheduler import Scheduler

log = logging.getLogger(__name__)
# a client's delayed updates that fail when due (past a size limit, a rule it broke): a warning each
# let one client write the log at its own pace (2,000 scheduled with delay=1 in 11 s: 2,000 lines,
# 582 KB, ~290 B each; the rotated files cycle in minutes). Counted in sepa_delayed_failed_total;
# the log gets one line a minute at most, the last failure's, with the count since (`refused`)
FAILED = QuietLog(log, "delayed update failed", level=logging.WARNING)
# any client with credentials can schedule and revoke at its own pace: one line a minute at most
REVOKED = QuietLog(log, "delayed update of a revoked token dropped")

MAX_SLEEP_S = 1.0  # wake at least this often, to notice wall-clock steps
# a change of the wall clock against CLOCK_BOOTTIME larger than this between two wakes of the timer
# is a step (NTP's slewing moves it by 0.5 ms a second at most); a smaller step moves no update
STEP_US = 1_000_000
# a reading of the clocks' offset whose two steady readings are further apart than this was
# interrupted (the thread lost the CPU between them) and is taken again
OFFSET_READ_US = 10_000
OFFSET_READS = 8
_STEADY = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)  # BOOTTIME counts a suspend too
# A delayed update is started at most this many times: once, and once more after a restart (the
# process may have died of something else, a kill -9 or a power cut). Started a third time, the
# process died while running it twice: it is abandoned, not replayed into a crash loop.
MAX_STARTS = 2
LATENESS_SAMPLES = 100_000
COMPACT_MIN = 64  # cancelled updates the timer's heap may hold before it is rebuilt without them


class TooManyPending(SepaError):
    """The table of pending delayed updates is full."""

    error = "too_many_requests"
    status_code = 429


def now_micros() -> int:
    """The wall clock in Unix microseconds: the engine clock's source."""
    return time.time_ns() // 1000


def clock_offset_us() -> int:
    """The wall clock less the steady clock (CLOCK_BOOTTIME), in microseconds: it changes only
    when the wall clock is set (stepped), or by NTP's slewing. Read at most OFFSET_READS times, the
    tightest reading kept: a thread that keeps losing the CPU between two readings (a board throttled
    by a CPU quota) must not loop for ever on the update thread."""
    best_span, best = 0, 0
    for attempt in range(OFFSET_READS):
        before = time.clock_gettime_ns(_STEADY)
        wall = time.time_ns()
        after = time.clock_gettime_ns(_STEADY)
        if attempt == 0 or after - before < best_span:
            best_span, best = after - before, (wall - (before + after) // 2) // 1000
        if best_span <= OFFSET_READ_US * 1000:
            break
    return best


@dataclass
class DelayedStats:
    """What the timer did since start-up (on /metrics and in the scheduling benchmark)."""

    scheduled: int = 0
    fired: int = 0
    failed: int = 0
    cancelled: int = 0  # by their client, or dropped: the registration that scheduled them ended
    recovered: int = 0
    abandoned: int = 0  # the gateway died while running them, MAX_STARTS times (see _fire)
    revoked: int = 0  # dropped, or refused when due: the token that scheduled them was revoked
    clock_steps: int = 0  # wall-clock steps seen by the timer (each moved the `delay` updates)
    lateness_us: deque[int] = field(default_factory=lambda: deque(maxlen=LATENESS_SAMPLES))
    max_lateness_us: int = 0


class DelayedUpdates:
    """Schedules, lists, cancels and fires delayed updates over one scheduler."""

    def __init__(
        self,
        scheduler: Scheduler,
        pending: PendingUpdates,
        *,
        max_pending: int = 100_000,
        max_pending_bytes: int = 64 << 20,
        max_pending_per_client: int = 10_000,
        max_pending_bytes_per_client: int = 4 << 20,
    ) -> None:
        """Limits: pending updates in total and per client (by count and by bytes of SPARQL text).
        A client is a secure owner, or the address a plain gate saw; after a restart, pending
        updates of plain-gate clients count towards the totals only (their address is not kept)."""
        self.scheduler = scheduler
        self.pending = pending
        self.max_pending = max_pending
        # Why bytes too: the timer kept every pending update's text in memory; 500 delayed updates of
        # 1 MB took RSS to 1.1 GB (and one GET /scheduled to 1.9 GB) under a count limit alone. The
        # text waits in the table now, in memory still without a data directory (an in-memory table).
        self.max_pending_bytes = max_pending_bytes
        self.max_pending_per_client = max_pending_per_client
        self.max_pending_bytes_per_client = max_pending_bytes_per_client
        self.stats = DelayedStats()
        # (due_us, seq, id, owner): what the timer needs to hand an update over when due, and no more;
        # its text and options stay in the table, read when it falls due (see Timer in the docstring)
        self._heap: list[tuple[int, int, str, str | None]] = []
        # ids of cancelled updates still in the heap: dropped when they come out of it, or all at once
        # when they are many (see cancel)
        self._cancelled: set[str] = set()
        self._count = len(pending)  # changed only by serial calls, on the update thread
        self._bytes = 0  # UTF-8 bytes of the pending updates' text, counted like _count
        self._clients: dict[str, str] = {}  # id -> client, for the per-client counts
        self._client_count: Counter[str] = Counter()
        self._client_bytes: Counter[str] = Counter()
        # owner -> registration -> ids of the secure clients' pending updates: what a reset or a
        # revocation leaves is found by registration, not by a scan of every pending update
        self._owned: dict[str, dict[str | None, set[str]]] = {}
        # registration -> jti -> (iat, how many of its updates are pending): which tokens a cut-off
        # covers. A count, not the ids: with a set of ids per token, what `start` held for 100,000
        # pending secure updates was 716 B an update when each had a token of its own (a set each),
        # 500 B with a count; 453 -> 340 B with 5,000 tokens shared by them (tracemalloc,
        # 2026-12-07, `PYTHONPATH=. python /tmp/atk-drv/tokmem.py each|shared`)
        self._tokens: dict[str, dict[str, tuple[int, int]]] = {}
        # id -> the clock offset (clock_offset_us) a pending `delay` update's due time was set in
        self._frames: dict[str, int] = {}
        self._offset = clock_offset_us()
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._batches: set[asyncio.Future[object]] = set()
        # the current rights of a delayed update's owner (set by the secure gates); raises when revoked
        self.access_of: Callable[[str, str | None], GraphAccess] | None = None
        # whether an (owner, registration) still stands, over the registry now (set by the secure gates)
        self.standing: Callable[[], Callable[[str, str | None], bool]] | None = None
        # whether the token (registration, jti, iat) was revoked (set by the secure gates)
        self.revoked: Callable[[str, str, int], bool] | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Settle what a killed process left, load the pending updates and start the timer.

        Overdue updates run at once, in due order. Idempotent; also called by the first `schedule`.
        """
        if self._task is not None:
            return
        store = self.scheduler.engine.store
        for tag in store.recovered_tags:
            if self.pending.remove(tag):
                self.stats.recovered += 1
                log.info("delayed update ran before the restart", extra={"id": tag})
        store.recovered_tags.clear()
        holds: list[tuple[str, int, str | None, str | None, str | None, int | None]] = []
        self._heap = []
        owners: dict[str, str] = {}  # one string per owner (and token), not one per row read
        for id, due_us, seq, size, owner, registration, jti, iat in self.pending.timings():
            if owner is not None:
                owner = owners.setdefault(owner, owner)
                registration = owners.setdefault(registration, registration) if registration is not None else None
                jti = owners.setdefault(jti, jti) if jti is not None else None
            self._heap.append((due_us, seq, id, owner))
            holds.append((id, size, owner, registration, jti, iat))
        heapq.heapify(self._heap)
        # updates a previous run scheduled are instants now: their due time was set on that run's
        # clock, which NTP had set, whereas this run's may be fake-hwclock's until NTP steps it
        self._offset = clock_offset_us()
        self._frames.clear()
        self._count = self._bytes = 0
        self._clients.clear()
        self._client_count.clear()
        self._client_bytes.clear()
        self._owned.clear()
        self._tokens.clear()
        for id, size, owner, registration, jti, iat in holds:
            self._hold(id, size, owner, owner, registration, jti, iat)
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._timer(), name="delayed-updates")

    async def stop(self) -> None:
        """Stop the timer; updates not yet run stay pending (they run at the next start)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._batches:
            await asyncio.gather(*self._batches, return_exceptions=True)

    # -- requests -----------------------------------------------------------------------------

    async def schedule(
        self,
        sparql: str,
        due_us: int,
        *,
        using_graph_uri: Sequence[str] = (),
        using_named_graph_uri: Sequence[str] = (),
        base_iri: str | None = None,
        owner: str | None = None,
        registration: str | None = None,
        client: str | None = None,
        access: GraphAccess | None = None,
        relative: bool = False,
        jti: str | None = None,
        iat: int | None = None,
    ) -> PendingUpdate:
        """Check and store an update due at `due_us`; raises what the update would raise if malformed.

        `relative`: `due_us` is the time of the request plus a `delay`, just read from the wall
        clock; a step of the wall clock moves it (see the module docstring).

        An `owner` (a secure client's identity) must still hold its rights when the update falls due,
        under the same `registration` (its client_id then): a reset of its secret drops what the old
        secret scheduled, as a revocation does. `jti` and `iat`: the owner's bearer token the request
        came with; a revocation of it drops the update (see the module docstring), and one already
        revoked when the update would be stored refuses it (401).
        The per-client limits count it for `owner`, else for `client` (an address). With `access`
        (the owner's rights now), a WHERE dataset naming a graph it may not read is refused now
        (403), as for an update now: it was accepted (202) and failed unseen when due."""
        frame = clock_offset_us()  # before any wait: the caller read the wall clock just now
        await self.start()
        engine = self.scheduler.engine
        using, named = tuple(using_graph_uri), tuple(using_named_graph_uri)

        def check_and_store() -> PendingUpdate:
            if self._revoked(registration, jti, iat):  # after a drop_revoked of it: see the module docstring
                raise Unauthorized("the token was revoked")
            if self._count >= self.max_pending:
                raise TooManyPending(f"{self.max_pending} delayed updates are already pending; retry later")
            size = _size(sparql)
            if self._bytes + size > self.max_pending_bytes:
                raise TooManyPending(
                    f"pending delayed updates would exceed {self.max_pending_bytes} bytes of SPARQL; retry later"
                )
            holder = owner if owner is not None else client
            if owner is not None and self._client_count[owner] >= self.max_pending_per_client:
                dropped.extend(self._drop_unregistered(owner))  # a reset's leftovers do not count
            if holder is not None:
                if self._client_count[holder] >= self.max_pending_per_client:
                    raise TooManyPending(f"this client has {self.max_pending_per_client} delayed updates pending")
                if self._client_bytes[holder] + size > self.max_pending_bytes_per_client:
                    raise TooManyPending(
                        f"this client's pending delayed updates would exceed {self.max_pending_bytes_per_client} bytes"
                    )
            engine.check_update(
                sparql, using_graph_uri=using, using_named_graph_uri=named, base_iri=base_iri, access=access
            )
            entry = self.pending.add(
                uuid.uuid4().hex,
                due_us,
                now_micros(),
                sparql,
                using_graph_uri=using,
                using_named_graph_uri=named,
                base_iri=base_iri,
                owner=owner,
                registration=registration,
                jti=jti,
                iat=iat,
            )
            if relative:
                self._frames[entry.id] = frame
            self._hold(entry.id, size, holder, owner, registration, jti, iat)
            return entry

        dropped: list[PendingUpdate] = []
        try:
            entry: PendingUpdate = await self.scheduler.serialized(check_and_store)
        finally:
            self._forget(dropped)
        self.stats.scheduled += 1
        self._push(entry)
        return entry

    async def cancel(self, id: str, owner: str | None = None, registration: str | None = None) -> PendingUpdate:
        """Cancel a pending update; NotFound when it is unknown, already ran or was cancelled, or
        (with `owner`) belongs to another client, or (with `registration`) to another registration
        of it (see :meth:`page`)."""
        entry = await self.scheduler.serialized(self._take, id, owner, registration)
        if entry is None:
            raise NotFound(f"no pending delayed update {id!r}")
        self._forget([entry])
        return entry

    async def drop_unregistered(self) -> int:
        """Drop the pending updates whose registration no longer stands (reset or revoked); how many.

        Why: they fail when due anyway (access_of), but until then, for years if so scheduled, the
        next registrant of the identity listed them with their text, could cancel them, and they
        counted against its max_pending_per_client. Called when the registry changed."""
        dropped = await self.scheduler.serialized(self._drop_unregistered)
        self._forget(dropped)
        if dropped:
            log.info("delayed updates of ended registrations dropped", extra={"count": len(dropped)})
        return len(dropped)

    def _drop_unregistered(self, owner: str | None = None) -> list[PendingUpdate]:
        """On the update thread: remove the pending updates (of `owner`, else of every owner) whose
        registration no longer stands; the entries removed."""
        if self.standing is None:
            return []
        stands = self.standing()
        owners = [owner] if owner is not None else list(self._owned)
        dropped: list[PendingUpdate] = []
        for who in owners:
            for registration, ids in list(self._owned.get(who, {}).items()):
                if stands(who, registration):
                    continue
                for id in list(ids):
                    entry = self.pending.get(id)
                    if entry is not None and self.pending.remove(id):
                        self._release(entry)
                        dropped.append(entry)
        return dropped

    async def drop_revoked(self, registration: str, jti: str, cut_off: int | None = None) -> int:
        """Drop the pending updates the token `jti` of `registration` scheduled, and with `cut_off`
        those of every token of it issued at or before then; how many. Why here and now: see the
        module docstring ("Revoked tokens"). Queued as due (ahead of the shared lane's calls, never
        refused by the queue's admission: a 429 here would leave them to run after a restart)."""
        dropped: list[PendingUpdate] = await self.scheduler.submit_due(
            lambda: self._drop_revoked(registration, jti, cut_off)
        )
        self._forget(dropped, cancelled=False)
        self.stats.revoked += len(dropped)
        for entry in dropped:
            REVOKED(id=entry.id)
        return len(dropped)

    def _drop_revoked(self, registration: str, jti: str, cut_off: int | None) -> list[PendingUpdate]:
        """On the update thread: remove the pending updates of the revoked tokens; the entries removed."""
        tokens = self._tokens.get(registration, {})
        if cut_off is None:
            revoked = [jti]
        else:  # this client's tokens with pending updates only: ~10,000 at most (max_pending_per_client)
            revoked = [token for token, (iat, _) in tokens.items() if token == jti or iat <= cut_off]
        dropped = self.pending.take_tokens([token for token in revoked if token in tokens])
        for entry in dropped:
            self._release(entry)
        return dropped

    def _revoked(self, registration: str | None, jti: str | None, iat: int | None) -> bool:
        """Whether the token a secure update came with was revoked (never for a plain gate's)."""
        if registration is None or jti is None or self.revoked is None:
            return False
        return self.revoked(registration, jti, iat if iat is not None else 0)

    def _forget(self, entries: list[PendingUpdate], *, cancelled: bool = True) -> None:
        """On the loop: count updates cancelled or dropped (unless `cancelled` is False: the caller
        counts them), and let the timer's heap forget them."""
        if cancelled:
            self.stats.cancelled += len(entries)
        # Why: the limits count pending updates only, so a client could schedule ten years ahead and
        # cancel, again and again; the heap kept every cancelled update and its text until its due
        # time (400 cycles of a 100 kB update: 400 entries, 40 MB, held for ten years). Rebuilt once
        # cancelled entries are half of it, the heap holds at most twice the pending updates.
        self._cancelled.update(entry.id for entry in entries)
        if len(self._cancelled) > max(COMPACT_MIN, len(self._heap) // 2):
            self._heap = [item for item in self._heap if item[2] not in self._cancelled]
            heapq.heapify(self._heap)
            self._cancelled.clear()

    def _take(self, id: str, owner: str | None = None, registration: str | None = None) -> PendingUpdate | None:
        entry = self.pending.get(id)
        if entry is None or (owner is not None and entry.owner != owner):
            return None
        if registration is not None and entry.registration not in (None, registration):
            return None
        if not self.pending.remove(id):
            return None
        self._release(entry)  # the heap entry is dropped when it falls due
        return entry

    def _hold(
        self,
        id: str,
        size: int,
        client: str | None,
        owner: str | None,
        registration: str | None,
        jti: str | None = None,
        iat: int | None = None,
    ) -> None:
        """Count a pending update against the limits, and file it under its token (on the update
        thread, or before the timer starts)."""
        self._count += 1
        self._bytes += size
        if client is not None:
            self._clients[id] = client
            self._client_count[client] += 1
            self._client_bytes[client] += size
        if owner is not None:
            self._owned.setdefault(owner, {}).setdefault(registration, set()).add(id)
        if registration is not None and jti is not None:
            tokens = self._tokens.setdefault(registration, {})
            issued, count = tokens.get(jti, (iat or 0, 0))
            tokens[jti] = (issued, count + 1)

    def _release(self, entry: PendingUpdate) -> None:
        self._frames.pop(entry.id, None)
        size = _size(entry.sparql)
        self._count -= 1
        self._bytes -= size
        client = self._clients.pop(entry.id, None)
        if client is not None:
            self._client_count[client] -= 1
            self._client_bytes[client] -= size
            if self._client_count[client] <= 0:
                del self._client_count[client], self._client_bytes[client]
        registrations = self._owned.get(entry.owner) if entry.owner is not None else None
        if registrations is not None:
            ids = registrations.get(entry.registration, set())
            ids.discard(entry.id)
            if not ids:
                registrations.pop(entry.registration, None)
                if not registrations:
                    del self._owned[entry.owner]  # type: ignore[arg-type]
        tokens = self._tokens.get(entry.registration) if entry.registration is not None else None
        if tokens is not None and entry.jti is not None and entry.jti in tokens:
            issued, count = tokens[entry.jti]
            if count > 1:
                tokens[entry.jti] = (issued, count - 1)
            else:
                del tokens[entry.jti]
                if not tokens:
                    del self._tokens[entry.registration]  # type: ignore[arg-type]

    async def list(self) -> list[PendingUpdate]:
        """Every pending update, in due order."""
        return await self.scheduler.run_query(self.pending.all)

    async def page(
        self, after: tuple[int, int] | None, limit: int, owner: str | None = None, registration: str | None = None
    ) -> list[PendingUpdate]:
        """Up to `limit` pending updates in due order after the position `after` (see PendingUpdates.page).

        With `registration` too, only what that registration of `owner` scheduled (and updates
        scheduled before registrations were kept): after a reset the next registrant of the
        identity saw the old registration's updates, text included, and could cancel them."""
        return await self.scheduler.run_query(lambda: self.pending.page(after, limit, owner, registration))

    @property
    def count(self) -> int:
        return self._count

    # -- the timer ----------------------------------------------------------------------------

    def _push(self, entry: PendingUpdate) -> None:
        heapq.heappush(self._heap, (entry.due_us, entry.seq, entry.id, entry.owner))
        if self._wake is not None and self._heap[0][2] == entry.id:
            self._wake.set()

    async def _timer(self) -> None:
        assert self._wake is not None
        while True:
            self._wake.clear()
            offset = clock_offset_us()
            if abs(offset - self._offset) > STEP_US:
                await self._rebase(offset)
            self._offset = offset
            now = now_micros()
            due: list[tuple[str, str | None]] = []
            while self._heap and self._heap[0][0] <= now:
                _, _, id, owner = heapq.heappop(self._heap)
                if id in self._cancelled:
                    self._cancelled.discard(id)
                else:
                    due.append((id, owner))
            for id, owner in due:
                self._hand_over(id, owner)
            if due:
                continue
            sleep_s = min((self._heap[0][0] - now) / 1_000_000, MAX_SLEEP_S) if self._heap else MAX_SLEEP_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), sleep_s)

    async def _rebase(self, offset: int) -> None:
        """The wall clock was stepped to `offset`: move each pending `delay` update by the step
        since its due time was set, in the heap and then in the table."""
        self.stats.clock_steps += 1
        moves: list[tuple[str, int]] = []
        for index, (due_us, seq, id, owner) in enumerate(self._heap):
            frame = self._frames.get(id)
            if frame is None or abs(offset - frame) <= STEP_US:
                continue
            moved = due_us + offset - frame
            self._frames[id] = offset
            self._heap[index] = (moved, seq, id, owner)
            moves.append((id, moved))
        heapq.heapify(self._heap)
        log.warning(
            "wall clock stepped",
            extra={"step_s": round((offset - self._offset) / 1e6, 3), "delayed_updates_moved": len(moves)},
        )
        if not moves:
            return
        # not through `serialized`: its admission refuses a full queue (429), and an error here
        # would end the timer, and every delayed update with it
        try:
            await self.scheduler.submit_due(lambda: self.pending.reschedule(moves))
        except Exception:
            log.exception("delayed updates moved by the step could not be stored: a restart finds them unmoved")

    def _hand_over(self, id: str, owner: str | None) -> None:
        """One serial call per due update, in its owner's lane: each may run to the time limit, and
        a call of 64 of them (BATCH, before) held every other client for 64 times the limit."""
        future = self.scheduler.submit_due(lambda: self._fire([id]), lane=owner)
        self._batches.add(future)
        future.add_done_callback(self._batch_done)

    def _batch_done(self, future: asyncio.Future[object]) -> None:
        self._batches.discard(future)
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            log.error("delayed updates could not be run", extra={"error": str(error)})
            return
        for entry in future.result():  # type: ignore[union-attr]
            self._push(entry)  # not due after all: the wall clock was stepped back

    def _fire(self, batch: list[str]) -> list[PendingUpdate]:
        """On the update thread: run each due update still pending (its row read now, text and all:
        the timer holds its id); returns those not yet due."""
        engine = self.scheduler.engine
        early: list[PendingUpdate] = []
        for id in batch:
            entry = self.pending.get(id)
            if entry is None:
                continue  # cancelled
            if entry.id not in self._frames and now_micros() < entry.due_us:
                # an instant not reached yet: the wall clock was stepped back. A `delay` update
                # the timer found due is due: the timer measured it in one frame of the clock
                early.append(entry)
                continue
            if self._revoked(entry.registration, entry.jti, entry.iat):
                # handed over before the revocation's drop ran: see the module docstring
                self.stats.revoked += 1
                if self.pending.remove(entry.id):
                    self._release(entry)
                REVOKED(id=entry.id)
                continue
            if self.pending.attempt(entry.id) > MAX_STARTS:
                # the process died while running it, MAX_STARTS times: running it again would be a crash loop
                self.stats.abandoned += 1
                if self.pending.remove(entry.id):
                    self._release(entry)
                log.error("delayed update abandoned: the gateway stopped while running it", extra={"id": entry.id})
                continue
            mark = ApplyMark(entry.id, lambda _tag, entry=entry: self._ran(entry))  # type: ignore[misc]
            try:
                access = None
                if entry.owner is not None:
                    if self.access_of is None:
                        raise Forbidden("a secure client's delayed update needs the secure gates to run")
                    access = self.access_of(entry.owner, entry.registration)
                # submitted, not waited for: its re-evaluations may still be queued (SpuManager.submit)
                engine.submit(
                    entry.sparql,
                    access=access,
                    using_graph_uri=entry.using_graph_uri,
                    using_named_graph_uri=entry.using_named_graph_uri,
                    base_iri=entry.base_iri,
                    mark=mark,
                )
            except SepaError as error:
                self.stats.failed += 1
                if self.pending.remove(entry.id):
                    self._release(entry)
                FAILED(id=entry.id, error=error.description)
            except Exception:
                self.stats.failed += 1
                if self.pending.remove(entry.id):
                    self._release(entry)
                log.exception("delayed update failed", extra={"id": entry.id})
        return early

    def _ran(self, entry: PendingUpdate) -> None:
        """The update's delta is in the store: its row goes in the same step (store.ApplyMark)."""
        try:
            self.pending.remove(entry.id)
        except sqlite3.Error:  # the update itself is in the store: it must still notify
            log.exception("could not mark a delayed update as run: it may run again after a restart")
        self._release(entry)
        self.stats.fired += 1
        # from its due time, or from when it was scheduled if that was later: an `at` in the past
        # (year 1) made the maximum 63,932,092,480 s
        lateness = self.scheduler.engine.store.clock.micros() - max(entry.due_us, entry.created_us)
        self.stats.lateness_us.append(lateness)
        self.stats.max_lateness_us = max(self.stats.max_lateness_us, lateness)


def _size(sparql: str) -> int:
    """What a pending update's text weighs against max_pending_bytes (UTF-8 bytes)."""
    return len(sparql) if sparql.isascii() else len(sparql.encode("utf-8"))
