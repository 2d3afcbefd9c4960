"""Literals as the store keeps them.

Oxigraph stores typed literals of the XSD value types by value and gives them back in canonical
form ("01"^^xsd:int comes back as "1"^^xsd:integer, "PT60S" as "PT1M"). Deltas, LUTT keys and
pattern constants must use that same form, or a notification would name a term the store does not
have and a constant would miss its own quads. The store itself is the authority: each literal of
an XSD datatype is round-tripped once through a scratch store, and the answer cached.

The cache is keyed by, and holds, plain strings, never pyoxigraph terms: terms are objects the
cyclic garbage collector tracks, strings (and tuples of them) are not. Sensor values, times and
sequence numbers make almost every literal new, so a cache of terms filled up with ~200k tracked
objects that every full collection walked: measured in the MQTT bench, 100-190 ms pauses every
2 s, holding the GIL, which were the whole p99 tail of the notification latency.
"""

from __future__ import annotations

import re
from functools import lru_cache

from pyoxigraph import Literal, NamedNode, Quad, Store

XSD = "http://www.w3.org/2001/XMLSchema#"
XSD_STRING = XSD + "string"
XSD_INTEGER = XSD + "integer"
# 18 digits at most: every such number fits the store's 64-bit integers
_CANONICAL_INTEGER = re.compile(r"0|-?[1-9][0-9]{0,17}")

_SUBJECT = NamedNode("urn:x-sepa:canonical")


@lru_cache(maxsize=8192)
def _round_trip(value: str, datatype: str) -> tuple[str, str] | None:
    """The stored (lexical form, datatype) of a typed literal; None when it is stored unchanged.

    8,192 entries (~340 bytes each): sensor readings' decimals and dateTimes are new each time and
    each filled an entry never used again, so 65,536 entries grew the gateway ~0.2 MB every 1,000
    updates up to ~22 MB (a 77,000-update soak under tracemalloc: the one cache still growing)."""
    # A fresh scratch store each time (~7 us): a reused in-memory store keeps what was removed
    # from it, and grows slower with every literal (measured: 0.5 ms per literal after 10k).
    scratch = Store()
    scratch.add(Quad(_SUBJECT, _SUBJECT, Literal(value, datatype=NamedNode(datatype))))
    (stored,) = scratch.quads_for_pattern(_SUBJECT, _SUBJECT, None, None)
    literal: Literal = stored.object  # type: ignore[assignment]
    canonical = (literal.value, literal.datatype.value)
    return None if canonical == (value, datatype) else canonical


def canonical(term: object) -> object:
    """The term as the store would give it back (only XSD-typed literals ever change).

    An xsd:integer already in canonical form (no sign but a minus, no leading zero, within the
    store's 64 bits) is given back as it is without asking the store: counters and sequence numbers
    in updates are new each time, and each filled a cache entry never used again (~350 bytes; 600
    a minute from `bench soak`'s updates alone)."""
    if type(term) is Literal:
        datatype = term.datatype.value
        if datatype == XSD_INTEGER and _CANONICAL_INTEGER.fullmatch(term.value):
            return term
        if datatype.startswith(XSD) and datatype != XSD_STRING:
            changed = _round_trip(term.value, datatype)
            if changed is not None:
                return Literal(changed[0], datatype=NamedNode(changed[1]))
    return term


def canonical_quad(quad: Quad) -> Quad:
    obj = quad.object
    if type(obj) is Literal:
        new = canonical(obj)
        if new is not obj:
            return Quad(quad.subject, quad.predicate, new, quad.graph_name)  # type: ignore[arg-type]
    return quad
