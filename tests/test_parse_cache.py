"""The update parse caches keep only requests that come back.

What it protects: notification latency. Every observation update is a new text with a new shape;
when each was cached, 4,096 plans held ~1.2M GC-tracked objects and every full collection walked
them for ~370 ms holding the GIL. A request seen twice is cached from then on (IoT producers that
repeat a request still parse it twice at most), and a cached plan gives the same result.
"""

from __future__ import annotations

import gc

from broker.core.engine import Engine
from broker.sparql import update_parser

EX = "http://example.org/"


def test_unique_requests_leave_nothing_in_the_caches() -> None:
    engine = Engine()
    update_parser._TEXTS.clear()
    update_parser._SHAPES.clear()
    gc.collect()
    before = len(gc.get_objects())
    for index in range(2000):
        engine.update(f"INSERT DATA {{ <{EX}s{index}> <{EX}p{index}> {index} . <{EX}s{index}> <{EX}q> 'x{index}' }}")
    gc.collect()
    assert len(update_parser._TEXTS) + len(update_parser._SHAPES) < 50
    assert len(gc.get_objects()) - before < 2000  # was ~20 tracked objects per request


def test_a_repeated_request_is_cached_from_its_second_use() -> None:
    engine = Engine()
    lamp = f"<{EX}lamp> <{EX}dim>"
    text = f"DELETE {{ {lamp} ?v }} INSERT {{ {lamp} 40 }} WHERE {{ OPTIONAL {{ {lamp} ?v }} }}"
    key = (text, None, ())
    update_parser._TEXTS.pop(key, None)
    first = engine.update(text)
    assert key not in update_parser._TEXTS
    assert engine.update(text).added == frozenset() and len(first.added) == 1
    assert key in update_parser._TEXTS
    assert engine.update(text.replace("40", "50")).added != frozenset()
