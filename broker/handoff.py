"""The one hand-off of engine callbacks to an event loop: every caller of one loop shares a FIFO,
and the loop is woken once per burst, not once per callback.

Why: the update thread hands each notification (one per subscription an update touches) and then
the publishers' replies to the loop. ``loop.call_soon_threadsafe`` writes to the loop's self-pipe
at every call; the write releases the GIL, and with the gateway's threads on one core (or simply
busy) the update thread then waits for the loop's thread to give it back, up to a switch interval
(5 ms) per callback. Profiled in `bench dashboard` (1,000 MQTT readings/s, a latest-view
subscription per sensor): 11 % of the update thread's samples were inside call_soon_threadsafe.
Here only the first callback of a burst wakes the loop; the rest join the queue it will drain.
Measured against the build before (a call_soon_threadsafe per callback), alternated in one sitting:
`bench coap --no-mqtt`, 4 pairs: readings/s 0.97x median (0.89-1.06, the noise), NL p99 21-38 ms
against 19-54 (lower in 3 of 4); `bench wire --no-oxigraph --updates 20000`, 3 pairs: 1.02x, 0
wrong, 0 missing; `bench lighting`: LAMP 50 ms against 49, ROAD 511 against 551. Not a speed-up
the noise shows; kept for the one order it gives every hand-off (replies included).

Order: one queue per loop, taken in call order whatever the calling thread, so notifications
keep the engine's order and a publisher's reply, handed over after the notifications of its
update, still comes after them. A callback for a loop that is already closed is dropped (nobody
is listening any more): raised into the engine's thread, it would fail somebody else's update.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

Callback = Callable[..., object]


class LoopHandoff:
    """Callbacks queued for one loop, run on it in call order by one drain per burst."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # the registry's value must not keep its key alive
        self._lock = threading.Lock()
        self._queued: list[tuple[Callback, tuple[Any, ...]]] = []
        self._drain_queued = False
        self._holding = threading.local()  # .depth: how many `held` blocks this thread is inside

    def call_soon(self, callback: Callback, *args: Any) -> None:
        """Run ``callback(*args)`` on the loop, after every callback handed over before it."""
        loop = self._loop()
        with self._lock:
            if self._drain_queued and (loop is None or loop.is_closed()):
                # closed with a drain pending: it will never run, keep nothing for it
                self._queued.clear()
                self._drain_queued = False
            self._queued.append((callback, args))
            if self._drain_queued or getattr(self._holding, "depth", 0):
                return
            self._drain_queued = True
        self._wake(loop)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Within it, this thread's callbacks queue without waking the loop; one wake-up at the end.

        Why: the loop drains a burst as soon as it is woken, so an update handing over one
        notification per subscription woke it again after each drain, and each wake-up gave the
        GIL to the loop's thread in the middle of the update (a ping-pong of up to one wake-up per
        notification). The scheduler's update thread holds its wake-ups for one engine call: its
        notifications reach the loop together when the call ends, which is at most the rest of
        that call's notifying later (the publisher's reply comes after them anyway). Another
        thread's callback still wakes the loop, which then drains the held ones with it, in order."""
        depth = getattr(self._holding, "depth", 0)
        self._holding.depth = depth + 1
        try:
            yield
        finally:
            self._holding.depth = depth
            if not depth:
                with self._lock:
                    wake = bool(self._queued) and not self._drain_queued
                    self._drain_queued = self._drain_queued or wake
                if wake:
                    self._wake(self._loop())

    def _wake(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Queue the drain on the loop (whose `_drain_queued` the caller set)."""
        try:
            if loop is None:
                raise RuntimeError("the loop is gone")
            if _running_loop() is loop:
                loop.call_soon(self._drain)  # on the loop's own thread: no wake-up needed
            else:
                loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed
            with self._lock:
                self._queued.clear()
                self._drain_queued = False

    def _drain(self) -> None:
        with self._lock:
            batch, self._queued = self._queued, []
            self._drain_queued = False
        for callback, args in batch:
            try:
                callback(*args)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as error:  # as the loop treats a failing callback: report, go on
                loop = self._loop()
                if loop is not None:
                    loop.call_exception_handler({"message": f"Exception in callback {callback!r}", "exception": error})


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


_handoffs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopHandoff] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def _handoff(loop: asyncio.AbstractEventLoop) -> LoopHandoff:
    with _registry_lock:
        handoff = _handoffs.get(loop)
        if handoff is None:
            handoff = _handoffs[loop] = LoopHandoff(loop)
    return handoff


def loop_handoff(loop: asyncio.AbstractEventLoop) -> Callable[..., None]:
    """The hand-off to `loop`: ``call(callback, *args)``, from any thread."""
    return _handoff(loop).call_soon


def wakes_held(loop: asyncio.AbstractEventLoop) -> contextlib.AbstractContextManager[None]:
    """:meth:`LoopHandoff.held` for `loop`: this thread's hand-offs to it wake it once, at the end."""
    return _handoff(loop).held()
