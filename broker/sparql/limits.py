"""Bounds on the structure of a SPARQL request, checked before pyoxigraph parses it.

Why: pyoxigraph's parser and evaluator recurse once per nesting level and once per element of a
group (a long run of BIND/OPTIONAL... becomes a left-deep join). A 200 KB request of nested braces, or
a 900 KB group of BINDs, overflows a thread's stack and the whole process dies with SIGSEGV (measured,
pyoxigraph 0.5). A gateway must answer such a request with an error, not crash: requests deeper than
MAX_NESTING or with more than MAX_GROUP_ELEMENTS of those keywords are refused, and the engine's threads
get a stack sized for what passes (WORKER_STACK_BYTES; the event loop's inline
updates are at most a few KB, within the main thread's 8 MB).

Operators recurse too, and brackets do not show them: 100,000 `!` in a FILTER, a chain of 10,000
`&&` or `+`, or a property path of 1,500 steps `<p>/<p>/...` crash pyoxigraph 0.5 on an 8 MB stack
(measured on this gateway's x86-64 test machine: 5,000 `!`, `&&` or `+` and 1,000 path steps pass).
So requests where one expression or path chains more than MAX_OPERATORS unary, logical,
arithmetic or path operators are refused too: operators are counted between brackets and statement
separators, so the many small expressions of an observation batch (a `?n + 1` per reading) do not
add up, while `!!!...`, `1 + 1 + ...` and `<p>/<p>/...` do.

The limits are far above real workloads: the MQTT adapter's largest batch (500 readings) uses ~1,000
group elements, nests 4 deep and has no operator.
"""

from __future__ import annotations

import re
from contextvars import ContextVar

from broker.errors import InvalidRequest, UpdateFailed

MAX_NESTING = 1000
MAX_GROUP_ELEMENTS = 10_000
MAX_OPERATORS = 500

# pyoxigraph recurses per nesting level and per group element; what these limits let through needs
# up to ~35 MB of stack (measured: 10,500 BINDs pass in 64 MB, 40,000 do not). Only the pages a
# request touches are committed, so the reservation costs address space, not memory. Kept here, not
# with the engine's threads (broker.scheduler): the worker processes import it without the engine.
WORKER_STACK_BYTES = 64 << 20

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
# `!` (not `!=`), `&&`, `||`, path `/` `|` `^` (not the `^^` of a typed literal), `*`, and a binary `+`
# (after an operand, not the exponent of a number): the operators pyoxigraph nests one level each
_OPERATOR = re.compile(r"!(?!=)|&&|\|\||(?<!\|)\|(?!\|)|(?<!\^)\^(?!\^)|/|\*|(?<![0-9.][eE])(?<=[\w)])\s*\+")
# what ends an operator chain: a bracket, or a separator of statements or of list elements
_CHAIN_END = re.compile(r"[{}()\[\];,]|\.(?=\s|$)")
_QUICK_BRACKETS = 200
_QUICK_OPERATORS = 400


def operator_count(sparql: str) -> int:
    """The operators of `sparql` in all, outside strings, IRIs and comments (a few counts when few)."""
    quick = sum(map(sparql.count, "!&|^/*+"))  # at least as many as there are operators
    if quick < _QUICK_OPERATORS:
        return quick
    return len(_OPERATOR.findall(_OPAQUE.sub(" ", sparql)))


def check_structure(sparql: str) -> None:
    """Raise InvalidRequest when `sparql` nests deeper or has more group elements than the engine takes."""
    if (
        sparql.count("{") + sparql.count("(") + sparql.count("[") < _QUICK_BRACKETS
        and len(sparql) < 20_000
        and sum(map(sparql.count, "!&|^/*+")) < _QUICK_OPERATORS
    ):
        return  # cannot reach any limit: the common case costs a few counts
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
    operators = max(len(_OPERATOR.findall(chain)) for chain in _CHAIN_END.split(structure))
    if operators > MAX_OPERATORS:
        raise InvalidRequest(
            f"the request chains {operators} operators (!, &&, ||, +, *, path steps...) in one expression "
            f"or path; at most {MAX_OPERATORS} are accepted"
        )
    elements = len(_ELEMENT.findall(structure))
    if elements > MAX_GROUP_ELEMENTS:
        raise InvalidRequest(
            f"the request has {elements} BIND/OPTIONAL/FILTER/... elements; at most {MAX_GROUP_ELEMENTS} are accepted"
        )


# the quads one INSERT/DELETE DATA block of the request being parsed may have (None: any), set by
# the update processor for a network client's request to its [engine] max_update_quads: the block
# is read no further past them. Why: `( 1 1 1 ... )` of 300,000 items (600 KB) is 600,000 quads,
# parsed in full on the update thread (2.3 s, every other client's updates waiting) before the
# size limit refused it (/tmp/atk-j/parse_stress.py "big coll")
DATA_QUAD_LIMIT: ContextVar[int | None] = ContextVar("DATA_QUAD_LIMIT", default=None)


def too_many_data_quads(limit: int) -> UpdateFailed:
    return UpdateFailed(
        f"the update would change more than {limit} quads (one DATA block; "
        "the limit of one request: [engine] max_update_quads)"
    )
