"""broker.handoff: engine callbacks reach their loop in call order, one wake-up per burst."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

from broker.handoff import loop_handoff, wakes_held


def test_the_loop_handoff_keeps_call_order_across_threads_and_runs_on_the_loop() -> None:
    """Engine callbacks reach the loop in call order whether they come from the update thread or
    from an inline update on the loop's own thread."""

    async def main() -> tuple[list[int], set[int], int]:
        loop = asyncio.get_running_loop()
        to_loop = loop_handoff(loop)
        seen: list[int] = []
        threads: set[int] = set()

        def record(value: int) -> None:
            seen.append(value)
            threads.add(threading.get_ident())

        to_loop(record, 1)
        worker = threading.Thread(target=lambda: [to_loop(record, value) for value in (2, 3)])
        worker.start()
        worker.join()
        to_loop(record, 4)
        assert seen == []  # queued, not called in place
        for _ in range(10):
            await asyncio.sleep(0)
        return seen, threads, threading.get_ident()

    seen, threads, loop_thread = asyncio.run(main())
    assert seen == [1, 2, 3, 4]
    assert threads == {loop_thread}


def test_a_burst_from_another_thread_wakes_the_loop_once_and_keeps_its_order() -> None:
    """The update thread hands over one callback per notification: only the first of a burst may
    write to the loop's self-pipe (each write gave the GIL away), the rest join its drain."""

    async def main() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        wakes = 0
        threadsafe = loop.call_soon_threadsafe

        def counting(callback: Any, *args: Any) -> Any:
            nonlocal wakes
            wakes += 1
            return threadsafe(callback, *args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        to_loop = loop_handoff(loop)
        seen: list[int] = []
        worker = threading.Thread(target=lambda: [to_loop(seen.append, value) for value in range(500)])
        worker.start()
        worker.join()  # the loop is held here, as it is when a busy update thread hands over
        for _ in range(100):
            await asyncio.sleep(0)
        return seen, wakes

    seen, wakes = asyncio.run(main())
    assert seen == list(range(500))
    assert wakes == 1


def test_a_failing_callback_is_reported_and_the_rest_still_run() -> None:
    async def main() -> tuple[list[int], list[dict[str, Any]]]:
        loop = asyncio.get_running_loop()
        reported: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        to_loop = loop_handoff(loop)
        seen: list[int] = []

        def fail() -> None:
            raise ValueError("a sink's bug")

        worker = threading.Thread(target=lambda: [to_loop(seen.append, 1), to_loop(fail), to_loop(seen.append, 2)])
        worker.start()
        worker.join()
        for _ in range(100):
            await asyncio.sleep(0)
        return seen, reported

    seen, reported = asyncio.run(main())
    assert seen == [1, 2]
    assert [type(context["exception"]) for context in reported] == [ValueError]


def test_callbacks_for_a_closed_loop_are_dropped_without_raising_into_the_caller() -> None:
    loop = asyncio.new_event_loop()
    to_loop = loop_handoff(loop)
    loop.close()
    outcome: list[BaseException | None] = []

    def engine_thread() -> None:
        try:
            to_loop(print, "never")
            to_loop(print, "never")
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    worker = threading.Thread(target=engine_thread)
    worker.start()
    worker.join()
    assert outcome == [None]


def test_a_loop_closed_with_its_drain_pending_keeps_nothing_for_it() -> None:
    """A loop stopped and closed before it ran the drain: later callbacks (an engine thread still
    notifying a subscription of that loop) are dropped, not kept for a drain that never comes."""
    loop = asyncio.new_event_loop()
    to_loop = loop_handoff(loop)
    worker = threading.Thread(target=lambda: to_loop(print, "never"))
    worker.start()
    worker.join()  # a drain is queued on the loop, which never runs it
    loop.close()
    handoff = to_loop.__self__  # type: ignore[attr-defined]
    worker = threading.Thread(target=lambda: [to_loop(print, "never") for _ in range(1000)])
    worker.start()
    worker.join()
    assert handoff._queued == []


def _counting_wakes(loop: asyncio.AbstractEventLoop) -> list[int]:
    """Count the hand-off's wake-ups of the loop from other threads in the list (not the executor's)."""
    wakes = [0]
    threadsafe = loop.call_soon_threadsafe

    def counting(callback: Any, *args: Any) -> Any:
        wakes[0] += getattr(callback, "__name__", "") == "_drain"
        return threadsafe(callback, *args)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    return wakes


def test_held_callbacks_wait_for_the_end_of_the_block_and_wake_the_loop_once() -> None:
    """Inside `wakes_held` a thread's callbacks queue: the loop, free to drain, runs none of them
    before the block ends, then all of them in order after one wake-up."""

    async def main() -> tuple[list[int], list[int], int]:
        loop = asyncio.get_running_loop()
        wakes = _counting_wakes(loop)
        to_loop = loop_handoff(loop)
        seen: list[int] = []
        during: list[int] = []
        handed, release = threading.Event(), threading.Event()

        def engine_thread() -> None:
            with wakes_held(loop):
                with wakes_held(loop):  # nested: only the outer end wakes
                    for value in range(100):
                        to_loop(seen.append, value)
                handed.set()
                release.wait(5)
                to_loop(seen.append, 100)

        worker = threading.Thread(target=engine_thread)
        worker.start()
        await loop.run_in_executor(None, handed.wait, 5)
        for _ in range(20):  # the loop is free: a woken drain would run now
            await asyncio.sleep(0.005)
        during = list(seen)
        release.set()
        await loop.run_in_executor(None, worker.join)
        for _ in range(100):
            await asyncio.sleep(0)
        return seen, during, wakes[0]

    seen, during, wakes = asyncio.run(main())
    assert during == []
    assert seen == list(range(101))
    assert wakes == 1


def test_an_update_notifying_many_subscriptions_wakes_the_loop_at_most_twice() -> None:
    """The scheduler's update thread holds its wake-ups for one engine call: an update that
    notifies 200 subscriptions wakes the loop once for them and at most once more for the reply,
    however often the loop's thread gets the GIL meanwhile (a switch interval of 10 us here)."""
    from broker.core.engine import Engine
    from broker.scheduler import Scheduler

    ex = "http://example.org/"

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        engine = Scheduler(Engine())
        try:
            subscriptions = [
                await engine.subscribe(f"SELECT ?v WHERE {{ <{ex}s{n}> <{ex}p> ?v }}", alias=str(n)) for n in range(200)
            ]
            wakes = _counting_wakes(loop)
            data = " ".join(f"<{ex}s{n}> <{ex}p> {n} ." for n in range(200))
            interval = sys.getswitchinterval()
            sys.setswitchinterval(1e-5)
            try:
                await engine.update(f"INSERT DATA {{ {data} }}")
            finally:
                sys.setswitchinterval(interval)
            notified = 0
            for subscription in subscriptions:
                async for notification in subscription:
                    if notification.sequence == 1:
                        notified += 1
                        break
            return wakes[0], notified
        finally:
            engine.close()

    wakes, notified = asyncio.run(main())
    assert notified == 200
    assert wakes <= 2
