"""What Python allocates at most while a call runs (tracemalloc): a start's or a seed's memory beside
the store, whose own memory (pyoxigraph's, in Rust) is not traced."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def traced_peak(call: Callable[[], T]) -> tuple[T, int]:
    """`call()`'s value, and the most bytes Python had allocated meanwhile (since the call began)."""
    tracemalloc.start()
    try:
        value = call()
        return value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
