"""The queue of serial calls (updates, subscribes, unsubscribes): one lane per client, taken in turn.

Why: serial calls run one at a time on the update thread, and one update may run up to the update
time limit. In one FIFO, one secure client's updates that each ran to the limit held every other
client's updates behind all of them: eight of them held a victim's update 24 s. Here each secure
client has a lane of its own, and the update thread takes one call from each lane with calls in
turn, so another client's update waits for at most one of that client's calls besides the one
running, however many it queued (measured: 2.7 s behind eight updates that each ran to a 1 s time
limit, 7.8 s before, `tests/broker/gates/test_fair_share.py`). Its reply then waited for one more:
the group commit of broker.scheduler acknowledged it with the call after it. So a lane whose last
call ran long is marked slow (:meth:`ran`), and the scheduler ends a group before such a lane's
turn (:meth:`next_is_slow`): 1.7 s now. A client's own calls keep their order. Calls that name no
client (the plain gates, whose local clients share an address, the adapters, the gateway's own
writers) share one lane, in arrival order, as before. A lane holds at most `lane_limit` calls:
one client cannot fill the whole queue (past it the scheduler answers 429 to that client alone).

Delayed updates falling due go in their owner's lane too (:meth:`append_due`), ahead of its other
calls but taking turns with the other lanes: run ahead of every lane, one client's delayed updates
that each ran to the time limit held everyone's updates behind all of them (8 due at the same
instant held a victim's one-triple update 16 s with a 2 s limit). Those of the shared lane (the
plain gates' clients) have a lane of their own, DUE_SHARED, taking turns with the shared lane:
ahead of it, 10,000 that a plain client scheduled to fall due at once held a bystander's one-triple
update 87 s, and every sensor's readings with it.

Appended on the event loop, taken on the update thread: a lock guards the lanes (uncontended,
~0.1 µs a call, next to the ~0.2 ms of the cheapest update).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

Item = TypeVar("Item")


DUE_SHARED = "\x00due"  # the lane of the shared lane's due calls (no client identity holds a NUL)


class LaneFull(Exception):
    """The client's lane holds its limit of calls already."""


class SerialLanes(Generic[Item]):
    """Items queued per lane (a client, or None), taken one per lane in turn."""

    def __init__(self, lane_limit: int) -> None:
        self.lane_limit = lane_limit
        self._lock = threading.Lock()
        self._lanes: dict[str | None, deque[Item]] = {}
        self._due: dict[str | None, deque[Item]] = {}  # a lane's due calls, taken before its others
        self._turns: deque[str | None] = deque()  # the lanes holding items, in the order they take them
        self._size = 0
        self._slow: set[str | None] = set()  # lanes whose last call ran long (see the module docstring)

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def append(self, item: Item, lane: str | None = None) -> None:
        """Queue `item` at the end of `lane`; LaneFull if a client's lane holds `lane_limit` items
        (the shared lane None is bounded by the scheduler's queue alone)."""
        with self._lock:
            queue = self._lanes.get(lane)
            if queue is None:
                queue = self._lanes[lane] = deque()
                if lane not in self._due:
                    self._turns.append(lane)
            elif lane is not None and len(queue) >= self.lane_limit:
                raise LaneFull(lane)
            queue.append(item)
            self._size += 1

    def append_due(self, item: Item, lane: str | None = None) -> None:
        """Queue a call that is due now (a delayed update) in `lane`, before the lane's other calls
        and after its earlier due ones. A lane with nothing queued takes the next turn, so a due
        call waits for no one when nobody else is queued. Never refused: it was admitted when
        it was scheduled. The shared lane's go in DUE_SHARED (see the module docstring)."""
        if lane is None:
            lane = DUE_SHARED
        with self._lock:
            due = self._due.get(lane)
            if due is None:
                due = self._due[lane] = deque()
                if lane not in self._lanes:
                    self._turns.appendleft(lane)
            due.append(item)
            self._size += 1

    def popleft(self) -> Item:
        """The first item of the lane whose turn it is; IndexError when there is none."""
        return self.pop()[1]

    def pop(self) -> tuple[str | None, Item]:
        """The lane whose turn it is and its first item; IndexError when there is none."""
        with self._lock:
            if not self._turns:
                raise IndexError("no serial call queued")
            lane = self._turns.popleft()
            due = self._due.get(lane)
            if due:
                item = due.popleft()
                if not due:
                    del self._due[lane]
            else:
                queue = self._lanes[lane]
                item = queue.popleft()
                if not queue:
                    del self._lanes[lane]
            self._size -= 1
            if lane in self._lanes or lane in self._due:
                self._turns.append(lane)
            return lane, item

    def next_is_slow(self) -> bool:
        """Whether the lane whose turn is next ran its last call long."""
        with self._lock:
            return bool(self._turns) and self._turns[0] in self._slow

    def ran(self, lane: str | None, slow: bool) -> None:
        """Record whether `lane`'s last call ran long (kept for the lanes of a few thousand clients)."""
        with self._lock:
            if not slow:
                self._slow.discard(lane)
                return
            if len(self._slow) >= 4096:
                self._slow.clear()
            self._slow.add(lane)
