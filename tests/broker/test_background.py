"""broker.background: native work on a thread at the lowest CPU priority."""

from __future__ import annotations

import os
import threading

import pytest
from pyoxigraph import Literal, NamedNode, Quad, Store

from broker.background import LOWEST, at_low_priority
from broker.store import copy_live


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_the_call_runs_at_the_lowest_priority_and_the_caller_keeps_its_own() -> None:
    before = _niceness()
    assert before < LOWEST
    assert at_low_priority(_niceness) == LOWEST
    assert _niceness() == before


def test_the_result_and_the_exception_come_back_to_the_caller() -> None:
    assert at_low_priority(lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(ValueError, match="refused"):
        at_low_priority(lambda: (_ for _ in ()).throw(ValueError("refused")))


def test_a_compaction_copies_the_store_on_a_low_priority_thread() -> None:
    """The copy's dump runs where its CPU yields to the gateway's other work (pyoxigraph's Store
    cannot be subclassed: a stand-in holding one records the niceness its dump ran at)."""
    seen: list[int] = []
    inner = Store()
    quads = [Quad(NamedNode(f"urn:s{i}"), NamedNode("urn:p"), Literal(i), NamedNode("urn:g")) for i in range(100)]
    inner.extend(quads)

    class Watched:
        def dump(self, *args: object, **kwargs: object) -> object:
            seen.append(_niceness())
            return inner.dump(*args, **kwargs)

    target = Store()
    assert copy_live(Watched(), target) == 100  # type: ignore[arg-type]
    assert seen == [LOWEST]
    assert set(target) == set(quads)
