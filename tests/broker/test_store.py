"""On-disk stores apply every update whole or not at all, even when the process is killed.

pyoxigraph has no transaction spanning removals and additions, so the store journals each delta
before applying it and replays the journal's complete records when it is opened again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from pyoxigraph import Literal, NamedNode, Quad

from broker.core.engine import Engine
from broker.store import JOURNAL, RdfStore, encode_journal_entry

EX = "http://example.org/"


def _quad(index: int) -> Quad:
    return Quad(NamedNode(f"{EX}s{index}"), NamedNode(f"{EX}p"), Literal(str(index)))


def test_a_complete_journal_is_finished_when_the_store_is_opened(tmp_path: Path) -> None:
    store = RdfStore.open(tmp_path)
    store.ox.extend([_quad(1), _quad(2)])
    store.close()
    del store
    # what a process killed after journalling, in the middle of applying, leaves behind
    (tmp_path / JOURNAL).write_bytes(encode_journal_entry([_quad(3)], [_quad(1), _quad(2)], [NamedNode(f"{EX}g")], []))
    reopened = RdfStore.open(tmp_path)
    assert reopened.quads() == {_quad(3)}
    assert list(reopened.ox.named_graphs()) == [NamedNode(f"{EX}g")]
    reopened.close()  # a checkpoint: the store flushed, the journal emptied
    assert (tmp_path / JOURNAL).read_bytes() == b""


def test_every_complete_record_of_the_journal_is_replayed_in_order(tmp_path: Path) -> None:
    """The journal is the write-ahead log: what a power cut leaves of RocksDB's unsynced writes does
    not matter, the synced records are replayed in order; a record cut at the end is ignored."""
    RdfStore.open(tmp_path).close()
    records = [
        encode_journal_entry([_quad(1), _quad(2)], [], [], []),
        encode_journal_entry([_quad(3)], [_quad(1)], [], [], "tag-a"),
        encode_journal_entry([_quad(1)], [_quad(3)], [], []),
    ]
    cut = encode_journal_entry([_quad(9)], [_quad(2)], [], [])[:-3]
    (tmp_path / JOURNAL).write_bytes(b"".join(records) + cut)
    reopened = RdfStore.open(tmp_path)
    assert reopened.quads() == {_quad(1), _quad(2)}
    assert reopened.recovered_tags == ["tag-a"]
    reopened.close()


def test_a_journal_cut_while_being_written_is_ignored(tmp_path: Path) -> None:
    store = RdfStore.open(tmp_path)
    store.ox.extend([_quad(1)])
    store.close()
    del store
    record = encode_journal_entry([_quad(3)], [_quad(1)], [], [])
    (tmp_path / JOURNAL).write_bytes(record[:-5])  # the apply had not started
    assert RdfStore.open(tmp_path).quads() == {_quad(1)}


def test_the_journal_is_emptied_at_a_checkpoint(tmp_path: Path) -> None:
    import broker.store

    engine = Engine(RdfStore.open(tmp_path))
    engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 1 }}")
    assert (tmp_path / JOURNAL).read_bytes().startswith(b"SEPA-DELTA")  # kept until a checkpoint
    limit, broker.store.CHECKPOINT_BYTES = broker.store.CHECKPOINT_BYTES, 1
    try:
        engine.update(f"DELETE DATA {{ <{EX}a> <{EX}p> 1 }}")
    finally:
        broker.store.CHECKPOINT_BYTES = limit
    assert (tmp_path / JOURNAL).read_bytes() == b""
    engine.store.close()


def test_killed_in_the_middle_of_a_large_delete_the_update_is_applied_whole(tmp_path: Path) -> None:
    """A real kill -9 while 200,000 quads are being removed one by one."""
    count = 200_000
    setup = Engine(RdfStore.open(tmp_path))
    setup.store.ox.extend(_quad(index) for index in range(count))
    setup.store.close()
    del setup
    child = textwrap.dedent(
        f"""
        from broker.core.engine import Engine
        from broker.store import RdfStore
        engine = Engine(RdfStore.open({str(tmp_path)!r}))
        engine.update("DELETE WHERE {{ ?s <{EX}p> ?o }}")
        """
    )
    process = subprocess.Popen([sys.executable, "-c", child])
    journal = tmp_path / JOURNAL
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if journal.exists() and journal.stat().st_size > 0:
            time.sleep(0.05)  # well inside the removals
            break
        time.sleep(0.001)
    assert process.poll() is None, "the child finished before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    reopened = RdfStore.open(tmp_path)
    assert len(reopened.quads()) == 0  # not some of the 200,000: all of them are gone
