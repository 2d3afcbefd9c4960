"""The exactly-once window of delayed updates: killed after the store write, before the row was deleted.

A real kill -9 rarely lands in that window (tests/broker/gates/test_delayed_persistence.py kills at random),
so this test leaves on disk exactly what such a kill leaves: the pending row, and the journal of
its delta with its tag. At start-up the update must count as run, not run again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pyoxigraph import Literal, NamedNode, Quad

from broker.core.engine import Engine
from broker.core.pending import PendingUpdates
from broker.scheduler import Scheduler
from broker.store import JOURNAL, RdfStore, encode_journal_entry

EX = "http://example.org/"
RAN = Quad(NamedNode(f"{EX}lamp"), NamedNode(f"{EX}status"), Literal("OFF"))


def test_an_update_journalled_with_its_tag_counts_as_run_after_a_kill(tmp_path: Path) -> None:
    pending = PendingUpdates(tmp_path)
    entry = pending.add("job-1", 0, 0, f'INSERT DATA {{ <{EX}lamp> <{EX}status> "OFF" . <{EX}lamp> <{EX}again> 1 }}')
    other = pending.add("job-2", 0, 0, f"INSERT DATA {{ <{EX}other> <{EX}ran> 1 }}")
    pending.close()
    RdfStore.open(tmp_path).close()
    (tmp_path / JOURNAL).write_bytes(
        encode_journal_entry([RAN], [], [], [], entry.id)
    )  # killed right after the store write

    store = RdfStore.open(tmp_path)
    assert store.recovered_tags == ["job-1"]
    pending = PendingUpdates(tmp_path)
    scheduler = Scheduler(Engine(store), pending=pending)

    async def run() -> None:
        await scheduler.delayed.start()
        for _ in range(200):
            if not pending.all():
                break
            await asyncio.sleep(0.01)
        await scheduler.delayed.stop()

    asyncio.run(run())
    scheduler.close()
    quads = store.quads()
    assert RAN in quads
    assert not any(quad.predicate == NamedNode(f"{EX}again") for quad in quads)  # job-1 did not run again
    assert any(quad.predicate == NamedNode(f"{EX}ran") for quad in quads)  # job-2 had not run: it runs now
    assert scheduler.delayed.stats.recovered == 1 and scheduler.delayed.stats.fired == 1
    assert pending.all() == [] and other.id == "job-2"


def test_pending_delayed_updates_are_limited_by_bytes_as_well_as_by_count() -> None:
    """500 delayed updates of 1 MB took RSS to 1.1 GB under a count limit alone: the text is bounded
    too (429 too_many_requests), and what runs or is cancelled gives its bytes back."""
    from broker.delayed import TooManyPending, now_micros

    big = 'INSERT DATA { <urn:s> <urn:p> "' + "x" * 4_000 + '" }'

    async def scenario() -> None:
        scheduler = Scheduler(Engine(), max_pending_bytes=10_000)
        try:
            later = now_micros() + 3_600_000_000
            first = await scheduler.delayed.schedule(big, later)
            await scheduler.delayed.schedule(big, later)
            try:
                await scheduler.delayed.schedule(big, later)
            except TooManyPending as error:
                assert error.status_code == 429 and "bytes" in error.description
            else:
                raise AssertionError("a third 4 KB update fitted in 10,000 bytes")
            await scheduler.delayed.cancel(first.id)
            await scheduler.delayed.schedule(big, later)  # the cancelled one's bytes are free again
            soon = await scheduler.delayed.schedule("INSERT DATA { <urn:s> <urn:p> 1 }", now_micros())
            for _ in range(200):
                if not any(entry.id == soon.id for entry in await scheduler.delayed.list()):
                    break
                await asyncio.sleep(0.01)
            assert scheduler.engine.query("ASK { <urn:s> <urn:p> 1 }").boolean
        finally:
            await scheduler.delayed.stop()
            scheduler.close()

    asyncio.run(scenario())
