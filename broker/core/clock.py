"""The engine clock: one time for the whole gateway, readable from SPARQL.

Seed 001 §II-C: the broker manages time so that clients need no clocks of their own. Two SPARQL
functions give the engine's current time, usable in updates and queries:

* `<http://w3id.org/sepa-gateway/fn#now>()`: an xsd:dateTime (UTC, microseconds);
* `<http://w3id.org/sepa-gateway/fn#nowMicros>()`: Unix time in microseconds, an xsd:integer.

Within one request every call returns the same value (an update and all the subscription
processing it causes see one instant), so timestamps written by one request agree.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from pyoxigraph import Literal, NamedNode

FUNCTIONS_NS = "http://w3id.org/sepa-gateway/fn#"
NOW = NamedNode(FUNCTIONS_NS + "now")
NOW_MICROS = NamedNode(FUNCTIONS_NS + "nowMicros")
XSD = "http://www.w3.org/2001/XMLSchema#"
_DATETIME = NamedNode(XSD + "dateTime")


def rfc3339(micros: int) -> str:
    """Unix microseconds as RFC 3339 UTC with microseconds, e.g. 2026-11-22T18:30:00.000000Z (exact, no float)."""
    instant = datetime.fromtimestamp(micros // 1_000_000, tz=UTC).replace(microsecond=micros % 1_000_000)
    return instant.isoformat(timespec="microseconds").replace("+00:00", "Z")


def micros_to_datetime(micros: int) -> Literal:
    """An xsd:dateTime literal (UTC) in the store's canonical form: RFC 3339 without the trailing
    zeros of the fraction (and without a fraction of zero), as pyoxigraph writes it back.

    Spelled out rather than asked of the store (:func:`broker.sparql.canonical.canonical`): every
    instant is new, so each asked for a scratch store (~7 us) and added an entry that was never
    used again to that function's cache, ~6,000 a minute under `bench soak` until its 65,536
    entries (~25 MB) were full. tests/broker/core/test_clock.py checks this form against the store."""
    head, _, fraction = rfc3339(micros)[:-1].partition(".")
    fraction = fraction.rstrip("0")
    return Literal(f"{head}.{fraction}Z" if fraction else f"{head}Z", datatype=_DATETIME)


class EngineClock:
    """Wall-clock time in microseconds, pinned for the duration of a request on its thread."""

    def __init__(self, source: Callable[[], int] = time.time_ns) -> None:
        self._source = source
        self._pinned = threading.local()

    def micros(self) -> int:
        pinned = getattr(self._pinned, "value", None)
        return pinned if pinned is not None else self._source() // 1000

    def pin(self, value: int | None = None) -> int:
        """Pin the clock on this thread until :meth:`unpin` (one request); returns the pinned value.

        `value` pins it at a given instant (a query worker evaluates at its broker's instant).
        A pair of calls rather than a context manager: the engine pins once per update, and a
        generator-based context manager costs more than the rest of the pinning."""
        if value is None:
            value = self._source() // 1000
        self._pinned.value = value
        return value

    def unpin(self) -> None:
        self._pinned.value = None

    def functions(self) -> dict[NamedNode, Callable[[], Literal]]:
        """pyoxigraph custom functions for one evaluation: both return this one instant."""
        value = self.micros()
        return {
            NOW: lambda: micros_to_datetime(value),
            NOW_MICROS: lambda: Literal(str(value), datatype=NamedNode(XSD + "integer")),
        }
