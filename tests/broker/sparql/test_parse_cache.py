"""The update parse caches keep only requests that come back.

What it protects: notification latency. Every observation update is a new text with a new shape;
when each was cached, 4,096 plans held ~1.2M GC-tracked objects and every full collection walked
them for ~370 ms holding the GIL. A request seen twice is cached from then on (IoT producers that
repeat a request still parse it twice at most), and a cached plan gives the same result.
"""

from __future__ import annotations

import gc

import pytest

from broker.core.engine import Engine
from broker.errors import InvalidRequest
from broker.sparql import update_parser
from broker.sparql.limits import MAX_NESTING

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


def test_a_too_deep_request_is_refused_by_the_parser_itself_and_never_cached() -> None:
    """The structure limits moved into parse_update (checked on a cache miss, before any parser)."""
    deep = "INSERT { <urn:a> <urn:b> 1 } WHERE " + "{" * (MAX_NESTING + 1) + "}" * (MAX_NESTING + 1)
    for _ in range(3):  # refused every time: a refused text is not cached, so never let through
        with pytest.raises(InvalidRequest, match="at most"):
            update_parser.parse_update(deep)
    assert (deep, None, ()) not in update_parser._TEXTS


def test_modify_operations_carry_their_skeleton_and_matched_deletes_after_shape_instantiation() -> None:
    """ModifyOp derives where_skeleton and delete_matches at construction, including the copies the
    shape cache makes for new constants (dataclasses.replace), so they always fit the operation."""
    update_parser._TEXTS.clear()
    update_parser._SHAPES.clear()
    texts = [
        f"DELETE {{ <{EX}lamp{index}> <{EX}dim> ?v }} INSERT {{ <{EX}lamp{index}> <{EX}dim> {index} }} "
        f"WHERE {{ <{EX}lamp{index}> <{EX}dim> ?v . ?v <{EX}unit> ?u }}"
        for index in range(4)
    ]
    for text in texts:  # the third and fourth come from the cached shape
        (operation,) = update_parser.parse_update(text).operations
        assert operation.delete_matches == (0,)
        assert operation.where_skeleton == ((None, None, "v", None), ("v", None, "u", None))
    (insert_only,) = update_parser.parse_update(f"INSERT {{ <{EX}s> <{EX}p> ?o }} WHERE {{ ?o <{EX}q> 1 }}").operations
    assert insert_only.delete_matches is None and insert_only.where_skeleton == (("o", None, None, None),)
    (unmatched,) = update_parser.parse_update(f"DELETE {{ ?s <{EX}p> 1 }} WHERE {{ ?s <{EX}q> 1 }}").operations
    assert unmatched.delete_matches is None
