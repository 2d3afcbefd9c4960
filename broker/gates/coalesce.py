"""Coalesced notifications: a subscription that asks for it (`coalesce_ms` in its subscribe) is
sent at most one notification per interval, carrying the net change since the one before.

Why: a live view of fast sensors does not need every intermediate value, and receiving them is
what a browser spends its CPU on. The dashboard's tiles subscription at 1,000 readings/s (100
sensors at 10 Hz) was 1,000 WSS frames a second to parse; headless Chromium spent 4.5-4.8 CPU-s
per 20 s on the page, and 2.9-3.6 CPU-s with the tiles coalesced to 250 ms (`sepa-gateway bench
dashboard --json`, 5 runs each alternated with the build before, 2026-12-04), on the cores the
gateway shares with it in the benchmark (and on a phone's battery in the field).

The contract stays that of PROTOCOL.md, over the notifications sent: each carries added = R_t
minus R_s and removed = R_s minus R_t, as multisets, where s is the previous notification sent,
so a client applying them in order still holds what the query returns now. The sequence numbers
are those of the engine's notifications: the last one merged (gaps are the merged ones). From
MIN_DEFER_S up the engine computes only one notification per interval in the first place
(:meth:`broker.core.spu_manager.SpuManager._defer`, which says what it saves): what arrives here
is then already coalesced, and this merges nothing. The first
notification after a quiet interval goes at once (a sensor reporting every minute is shown as soon
as it reports), and one whose net change is empty is not sent at all. Off unless asked for: every
other client gets every notification, as PROTOCOL.md says.

Sans-I/O: :class:`Coalescing` is told the time; the gate (broker.gates.websocket) owns the timer.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from broker.core.notification import Notification
from broker.sparql.terms import Row

# the longest interval a client may ask for: a held net change is at most a subscription's rows,
# but a view minutes behind is no view
MAX_COALESCE_MS = 10_000


class NetChange:
    """Notifications of one subscription, not yet sent, as one: signed counts of rows (an ASK
    subscription's: the value before the first and the latest)."""

    def __init__(self, first: Notification) -> None:
        self.latest = first
        self.previous = first.previous
        self.counts: dict[Row, int] = {}
        self.add(first)

    def add(self, notification: Notification) -> None:
        """Merge a later notification. A row whose count comes back to 0 is forgotten, so what is
        held is the net change, at most the rows the subscription held then and holds now (bounded
        by the gateway's row limits), not every row that came and went in the interval: a query
        whose rows are all new at each update held 10,000 forgotten rows per 10 s at 1,000 updates/s."""
        counts = self.counts
        for rows, step in ((notification.added, 1), (notification.removed, -1)):
            for row in rows:
                count = counts.get(row, 0) + step
                if count:
                    counts[row] = count
                else:
                    del counts[row]
        self.latest = notification

    def notification(self) -> Notification | None:
        """The merged notification, or None when the merged ones cancel out."""
        latest = self.latest
        if latest.boolean is not None:
            return None if latest.boolean == self.previous else dataclasses.replace(latest, previous=self.previous)
        added: list[Row] = []
        removed: list[Row] = []
        for row, count in self.counts.items():
            if count > 0:
                added += [row] * count
            elif count < 0:
                removed += [row] * -count
        if not added and not removed:
            return None
        return dataclasses.replace(latest, added=tuple(added), removed=tuple(removed))


@dataclass(slots=True)
class Coalescing:
    """When one subscription's notifications go out: at most one per `interval_s`."""

    interval_s: float
    sent_at: float = -math.inf
    held: NetChange | None = None
    timer: object | None = field(default=None, repr=False)  # the gate's handle of the pending flush

    def offer(self, notification: Notification, now: float) -> Notification | None:
        """The notification to send now, or None: then it is held, and :meth:`due_at` says when
        :meth:`flush` should send what is held."""
        if self.held is None and now - self.sent_at >= self.interval_s:
            self.sent_at = now
            return notification
        if self.held is None:
            self.held = NetChange(notification)
        else:
            self.held.add(notification)
        return None

    def due_at(self) -> float:
        return self.sent_at + self.interval_s

    def flush(self, now: float) -> Notification | None:
        """What is held, as one notification (None: nothing, or nothing left once merged)."""
        held, self.held, self.timer = self.held, None, None
        if held is None:
            return None
        self.sent_at = now
        return held.notification()


def coalesce_interval(value: object) -> float | None:
    """A subscribe's `coalesce_ms` as seconds (0: every notification); None when it is not a
    number of milliseconds from 0 to MAX_COALESCE_MS."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_COALESCE_MS:
        return None
    return float(value) / 1000.0
