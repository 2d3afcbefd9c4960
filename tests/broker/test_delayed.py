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
