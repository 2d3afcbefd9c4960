"""The journal's sync helper (broker.journal_sync): marks confirmed only after its fdatasync, one
sync for many waiters, and an end of the helper that nobody waits for in vain."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from broker.journal_sync import HelperGone, JournalSyncer


def _journal(tmp_path: Path) -> Path:
    journal = tmp_path / "apply.journal"
    journal.write_bytes(b"SEPA-DELTA\n")
    return journal


def test_every_waiter_is_answered_once_a_sync_covers_its_mark(tmp_path: Path) -> None:
    async def main() -> None:
        syncer = JournalSyncer([_journal(tmp_path)], asyncio.get_running_loop())
        try:
            await asyncio.wait_for(asyncio.gather(*(syncer.durable(mark) for mark in range(1, 101))), 10)
            assert syncer.synced == 100
            await syncer.durable(50)  # covered already: no new sync needed
        finally:
            syncer.close()

    asyncio.run(main())


def test_waiters_learn_that_the_helper_ended_and_later_calls_are_refused(tmp_path: Path) -> None:
    async def main() -> None:
        syncer = JournalSyncer([_journal(tmp_path)], asyncio.get_running_loop())
        try:
            await syncer.durable(1)
            os.kill(syncer.pid, signal.SIGSTOP)  # the next sync cannot be confirmed
            waiting = asyncio.ensure_future(syncer.durable(2))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            os.kill(syncer.pid, signal.SIGKILL)
            with pytest.raises(HelperGone):
                await asyncio.wait_for(waiting, 10)
            assert not syncer.alive and syncer.synced == 1
            with pytest.raises(HelperGone):
                await syncer.durable(3)
        finally:
            syncer.close()

    asyncio.run(main())


def test_the_helper_ignores_the_signals_of_its_process_group(tmp_path: Path) -> None:
    async def main() -> None:
        syncer = JournalSyncer([_journal(tmp_path)], asyncio.get_running_loop())
        try:
            await syncer.durable(1)
            os.kill(syncer.pid, signal.SIGINT)
            os.kill(syncer.pid, signal.SIGTERM)
            await asyncio.wait_for(syncer.durable(2), 10)
            assert syncer.alive
        finally:
            syncer.close()

    asyncio.run(main())


def test_closed_from_another_thread_the_helper_is_reaped_and_the_loop_lets_go_of_it(tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        syncer = JournalSyncer([_journal(tmp_path)], loop)
        await syncer.durable(1)
        closer = threading.Thread(target=syncer.close)
        closer.start()
        await loop.run_in_executor(None, closer.join)
        await asyncio.sleep(0.05)  # the loop runs the release the closing thread handed it
        assert syncer.pid not in _children()
        assert not syncer.alive
        with pytest.raises(HelperGone):
            await syncer.durable(2)

    asyncio.run(main())


def _children() -> set[int]:
    """Processes of this test process that are still alive or not yet reaped."""
    found: set[int] = set()
    for thread in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            found |= {int(pid) for pid in Path(f"/proc/{os.getpid()}/task/{thread}/children").read_text().split()}
        except OSError:
            continue
    return found


def test_each_mark_is_synced_in_the_journal_it_names(tmp_path: Path) -> None:
    """A resident store writes one of two journals (broker.store): the helper syncs the one a mark
    names, and only that one (on ext4 an fdatasync of a clean file still flushes the device)."""
    if shutil.which("strace") is None:
        pytest.fail("strace is not installed (tests/run.sh installs it)", pytrace=False)
    journals = [tmp_path / "apply.journal.0", tmp_path / "apply.journal.1"]
    for journal in journals:
        journal.write_bytes(b"SEPA-DELTA\n")
    trace = tmp_path / "trace.txt"

    async def main() -> None:
        syncer = JournalSyncer(journals, asyncio.get_running_loop())
        tracer = subprocess.Popen(
            ["strace", "-y", "-e", "trace=fdatasync", "-o", str(trace), "-p", str(syncer.pid)],
            stderr=subprocess.DEVNULL,
        )
        try:
            await asyncio.sleep(1.0)  # attached
            await asyncio.wait_for(syncer.durable(1, 1), 10)
            await asyncio.wait_for(syncer.durable(2, 0), 10)
            await asyncio.wait_for(syncer.durable(3, 1), 10)
            assert syncer.synced == 3
        finally:
            tracer.send_signal(signal.SIGINT)
            tracer.wait(10)
            syncer.close()

    asyncio.run(main())
    synced = [line.split("<", 1)[1].split(">", 1)[0] for line in trace.read_text().splitlines() if "fdatasync(" in line]
    assert synced == [str(journals[1]), str(journals[0]), str(journals[1])]
