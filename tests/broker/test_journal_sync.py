"""The journal's sync helper (broker.journal_sync): marks confirmed only after its fdatasync, one
sync for many waiters, and an end of the helper that nobody waits for in vain."""

from __future__ import annotations

import asyncio
import os
import signal
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
