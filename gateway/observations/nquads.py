"""Quads whose object is a literal, made from N-Quads lines instead of one `Quad(...)` call each.

Why: pyoxigraph's `Quad(s, p, o, g)` tries the object as a NamedNode, then a BlankNode, and only
then as a Literal, and each failed try builds and formats a Python TypeError: 3.4 us a quad with a
literal against 0.5 us with an IRI (pyoxigraph 0.5.13, timeit, 2026-12-07). An observation batch
makes five such quads a reading (values, sequence numbers, topics), and the MQTT delivery records
one a message: ~14 % of the instructions of the MQTT commit path, engine included (callgrind of
/tmp/atk-ing/micro_cg.py 50 20, 2026-12-07). Written as N-Quads lines and parsed in one call they
cost ~1.5 us each, the line's text included.

The lines must be made from terms' own N-Triples forms (`str(term)`, or IRIs the gateway mints
itself), which the parser reads back to equal terms: so the parser's IRI checks are skipped
(`lenient`), the terms having been checked when they were made.
"""

from __future__ import annotations

from pyoxigraph import Quad, RdfFormat, parse

XSD_INTEGER = "<http://www.w3.org/2001/XMLSchema#integer>"


def literal_quads(lines: list[str]) -> list[Quad]:
    """The quads of `lines` (each `<s> <p> "o"... <g> .` and a newline), in order."""
    if not lines:
        return []
    return list(parse("".join(lines), format=RdfFormat.N_QUADS, lenient=True))


def integer_text(number: int) -> str:
    """The N-Triples form of `Literal(number)` for an int (an xsd:integer)."""
    return f'"{number}"^^{XSD_INTEGER}'
