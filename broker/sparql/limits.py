"""Bounds on the structure of a SPARQL request, checked before pyoxigraph parses it.

Why: pyoxigraph's parser and evaluator recurse once per nesting level and once per element of a
group (a long run of BIND/OPTIONAL... becomes a left-deep join). A 200 KB request of nested braces, or
a 900 KB group of BINDs, overflows a thread's stack and the whole process dies with SIGSEGV (measured,
pyoxigraph 0.5). A gateway must answer such a request with an error, not crash: requests deeper than
MAX_NESTING or with more than MAX_GROUP_ELEMENTS of those keywords are refused, and the engine's threads
get a stack sized for what passes (broker.scheduler.WORKER_STACK_BYTES; the event loop's inline
updates are at most a few KB, within the main thread's 8 MB).

The limits are far above real workloads: the MQTT adapter's largest batch (500 readings) uses ~1,000
group elements and nests 4 deep.
"""

from __future__ import annotations

import re

from broker.errors import InvalidRequest

MAX_NESTING = 1000
MAX_GROUP_ELEMENTS = 10_000

# strings, IRIs and comments hold brackets and keywords that are not structure
_OPAQUE = re.compile(
    r'"""(?:[^"\\]|\\.|"(?!""))*"""'
    r"|'''(?:[^'\\]|\\.|'(?!''))*'''"
    r'|"(?:[^"\\\n]|\\.)*"'
    r"|'(?:[^'\\\n]|\\.)*'"
    r"|<[^<>\"{}|^`\\\x00-\x20]*>"
    r"|#[^\n]*",
    re.DOTALL,
)
_NOT_BRACKET = re.compile(r"[^{}()\[\]]+")
_ELEMENT = re.compile(r"\b(?:BIND|OPTIONAL|MINUS|UNION|FILTER|VALUES|GRAPH|SERVICE|EXISTS)\b", re.IGNORECASE)
_QUICK_BRACKETS = 200


def check_structure(sparql: str) -> None:
    """Raise InvalidRequest when `sparql` nests deeper or has more group elements than the engine takes."""
    if sparql.count("{") + sparql.count("(") + sparql.count("[") < _QUICK_BRACKETS and len(sparql) < 20_000:
        return  # cannot reach either limit: the common case costs three counts
    structure = _OPAQUE.sub(" ", sparql)
    depth = deepest = 0
    for bracket in _NOT_BRACKET.sub("", structure):
        if bracket in "{([":
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    if deepest > MAX_NESTING:
        raise InvalidRequest(f"the request nests {deepest} levels deep; at most {MAX_NESTING} are accepted")
    elements = len(_ELEMENT.findall(structure))
    if elements > MAX_GROUP_ELEMENTS:
        raise InvalidRequest(
            f"the request has {elements} BIND/OPTIONAL/FILTER/... elements; at most {MAX_GROUP_ELEMENTS} are accepted"
        )
