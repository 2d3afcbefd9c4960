"""Parsed update requests cached by *shape*: the request with its IRIs and strings taken out.

IoT producers send the same request again and again with other constants (another lamp, another
reading). One cheap regular-expression split finds those constants; the request with placeholders
in their place is parsed once, and each later request of the same shape only converts its own
constants and puts them in the cached plan. A placeholder is valid exactly where the constant it
stands for is, so the shape parse also validates the instance.

Unquoted numbers are constants too (a sensor's ``ex:value 21.7``): each stands in the shape as a
typed placeholder literal of its own XSD type (INTEGER, DECIMAL, DOUBLE), so a reading's update
keeps its shape. Before, every new value was a new shape and took the full parse: 241 us against
73 us a request (/tmp/shape_bench.py, a DELETE/INSERT of one reading and its time). A number right
after LIMIT or OFFSET stays in the shape (a placeholder is no integer token there), and a shape
whose placeholder the grammar refuses (a signed number as the right operand of an expression)
is cached as "no plan": its requests take the full parse, as before.

Requests the split cannot read safely (single-quoted or long strings, escapes, BASE, relative
IRIs) take the ordinary parse. The cache key includes the base IRI the request is parsed with.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from pyoxigraph import Literal, NamedNode, Quad

from broker.sparql.canonical import canonical
from broker.sparql.operations import DataOp, GraphOp, LoadOp, ModifyOp, ParsedUpdate
from broker.sparql.patterns import QuadPattern

# A number token (SPARQL's DOUBLE, DECIMAL, INTEGER, signed or not) not inside a name, a variable, a
# blank node label or a language tag: nothing of those may come right before it.
_NUMBER = (
    r"(?=[+\-\d.])(?<![\w:?$@.%+\-])[+-]?"
    r"(?:\d+\.\d*[eE][+-]?\d+|\.\d+[eE][+-]?\d+|\d+[eE][+-]?\d+|\d*\.\d+|\d+)(?![\w:])"
)
_SPLIT = re.compile(r"""(<[^<>"{}|^`\\\x00-\x20]*>|"[^"\\\n\r]*"|#[^\n]*|""" + _NUMBER + ")")
_PROLOGUE_TAIL = re.compile(r"(?:PREFIX\s+[^\s:]*:\s*)$", re.IGNORECASE)
_COUNT_TAIL = re.compile(r"\b(?:LIMIT|OFFSET)\s*$", re.IGNORECASE)
_UNSAFE = re.compile(r"'|\\|\bBASE\b", re.IGNORECASE)
_PLACEHOLDER = re.compile(r'<urn:x-sepa-slot:(\d+)>|"x-sepa-slot:(\d+)"|"x-sepa-number:(\d+)"\^\^<[^>]*>')
IRI_SLOT = "urn:x-sepa-slot:"
STRING_SLOT = "x-sepa-slot:"
NUMBER_SLOT = "x-sepa-number:"
XSD = "http://www.w3.org/2001/XMLSchema#"

Constants = list[NamedNode | str]


def split_shape(text: str) -> tuple[str, list[str], Constants] | None:
    """(shape text, original constant texts, constants) or None when the request is not simple."""
    parts = _SPLIT.split(text)
    if len(parts) == 1 or _UNSAFE.search(text):
        return None
    originals: list[str] = []
    constants: Constants = []
    for index in range(1, len(parts), 2):
        part = parts[index]
        first = part[0]
        if (
            first == "#"
            or (first == "<" and (_PROLOGUE_TAIL.search(parts[index - 1]) or parts[index - 1].rstrip().endswith("^^")))
            or (first != "<" and first != '"' and _COUNT_TAIL.search(parts[index - 1]))
        ):
            continue  # comments, prefix declarations, datatype IRIs and LIMIT/OFFSET are the shape's
        slot = len(originals)
        originals.append(part)
        if first == "<":
            try:
                constants.append(NamedNode(part[1:-1]))
            except ValueError:
                return None
            parts[index] = f"<{IRI_SLOT}{slot}>"
        elif first == '"':
            constants.append(part[1:-1])
            parts[index] = f'"{STRING_SLOT}{slot}"'
        else:
            constants.append(part)
            parts[index] = f'"{NUMBER_SLOT}{slot}"^^<{XSD}{_number_type(part)}>'
    return "".join(parts), originals, constants


def _number_type(text: str) -> str:
    """The XSD datatype of an unquoted number, as the grammar types it."""
    if "e" in text or "E" in text:
        return "double"
    return "decimal" if "." in text else "integer"


def _term(term: object, constants: Constants) -> object:
    if isinstance(term, NamedNode):
        value = term.value
        if value.startswith(IRI_SLOT):
            return constants[int(value[len(IRI_SLOT) :])]
    elif isinstance(term, Literal):
        value = term.value
        if value.startswith(STRING_SLOT) or value.startswith(NUMBER_SLOT):
            text = constants[int(value.rpartition(":")[2])]
            if term.language:
                return Literal(text, language=term.language)  # type: ignore[arg-type]
            return canonical(Literal(text, datatype=term.datatype))  # type: ignore[arg-type]
    return term


def _patterns(patterns: tuple[QuadPattern, ...] | None, constants: Constants) -> tuple[QuadPattern, ...] | None:
    if patterns is None:
        return None
    return tuple(
        QuadPattern(
            _term(p.subject, constants),  # type: ignore[arg-type]
            _term(p.predicate, constants),  # type: ignore[arg-type]
            _term(p.object, constants),  # type: ignore[arg-type]
            _term(p.graph, constants),  # type: ignore[arg-type]
        )
        for p in patterns
    )


def instantiate(plan: ParsedUpdate, originals: list[str], constants: Constants) -> ParsedUpdate:
    """The cached plan of a shape with this request's constants put back."""

    def text(match: re.Match[str]) -> str:
        return originals[int(match.group(1) or match.group(2) or match.group(3))]

    term: Callable[[object], object] = lambda t: _term(t, constants)  # noqa: E731

    def quads(ground: tuple[Quad, ...]) -> tuple[Quad, ...]:
        return tuple(
            Quad(term(q.subject), term(q.predicate), term(q.object), term(q.graph_name))  # type: ignore[arg-type]
            for q in ground
        )

    operations = []
    for operation in plan.operations:
        if isinstance(operation, DataOp):
            operations.append(DataOp(operation.insert, quads(operation.quads)))
        elif isinstance(operation, ModifyOp):
            operations.append(
                replace(
                    operation,
                    delete=_patterns(operation.delete, constants),
                    insert=_patterns(operation.insert, constants),
                    delete_ground=quads(operation.delete_ground),
                    insert_ground=quads(operation.insert_ground),
                    where_query=_PLACEHOLDER.sub(text, operation.where_query),
                    where_bgp=_patterns(operation.where_bgp, constants),
                    where_optionals=tuple(_patterns(block, constants) for block in operation.where_optionals),
                    where_pins=tuple((name, term(value)) for name, value in operation.where_pins),
                    where_values=None
                    if operation.where_values is None
                    else (operation.where_values[0], tuple(term(value) for value in operation.where_values[1])),
                    with_graph=term(operation.with_graph),
                    using=tuple(term(g) for g in operation.using),
                    using_named=tuple(term(g) for g in operation.using_named),
                )
            )
        elif isinstance(operation, GraphOp):
            operations.append(replace(operation, target=term(operation.target), source=term(operation.source)))
        elif isinstance(operation, LoadOp):
            operations.append(replace(operation, source=term(operation.source), into=term(operation.into)))
    return ParsedUpdate(operations)  # type: ignore[arg-type]
