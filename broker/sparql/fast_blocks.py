"""Quad blocks and WHERE groups found without tokenizing them in Python.

A batch update of a few hundred readings is ~250 KB of quad blocks: tokenizing it one Python step
per token cost more than everything else the engine does with it. Here each block is crossed by
one regular expression run in C per brace, and handed to pyoxigraph's TriG parser nearly as is.

Why the cut is where the tokenizer would put it: the runs below consume strings, IRIs, comments
and prefixed-name escapes with the tokenizer's own expressions, and every other character only
when it cannot start or continue one of those. `"`, `'`, `<`, `#`, `\\`, `{` and `}` only ever mean
one thing outside them, so a brace found by a run is a brace token. Everything else a block may
hold is a closed set of name, number and punctuation characters; anything outside it (RDF 1.2
syntax such as `~`, `<<`, `{|`, `--`, an operator, an unexpected character) stops the run, and the
caller falls back to the tokenizing parser, which decides, and words any error, as before.

Within that character set, TriG inside `{ }` accepts exactly the triples a SPARQL quad block does
(keywords other than `a`, `true`, `false` are not RDF terms to it either), so the checks the
tokenizing parser makes per token reduce to three flags: variables, blank nodes, labels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from broker.sparql.patterns import VAR_IRI
from broker.sparql.tokens import (
    BLOCK_CHARS,
    IRI_PATTERN,
    PN_ESCAPE,
    PNAME_PATTERN,
    STRING_PATTERN,
    VAR_PATTERN,
    capturing,
)

# No capturing group may sit inside a possessive repeat (CPython 3.11 raises SystemError on some),
# so the characters that set a flag stop the run and are looked at in Python (a few per block).
_BLOCK_RUN = re.compile(rf"(?:[{BLOCK_CHARS}]++|{STRING_PATTERN}|{IRI_PATTERN}|{PN_ESCAPE}|_(?!:)|-(?!-))*+")
_COMMENT = re.compile(r"#[^\r\n]*")
_GROUP_RUN = re.compile(rf"""(?:[^"'<#{{}}\\]++|{STRING_PATTERN}|{IRI_PATTERN}|<|{PN_ESCAPE}|#[^\r\n]*)*+""")
_GRAPH_TAIL = re.compile(rf"(?i:GRAPH)\s+(?:{IRI_PATTERN}|{VAR_PATTERN}|{PNAME_PATTERN})\s*\Z")
_DOT = re.compile(r"\s*\.(?![0-9])")
# Everything up to the next variable (in one match, so one Python call per variable), then it.
_VARIABLES = re.compile(
    rf"""((?:[^"'<#\\?$]++|{STRING_PATTERN}|{IRI_PATTERN}|<|{PN_ESCAPE}|#[^\r\n]*)*+)({VAR_PATTERN})?"""
)
_LABELS = capturing("BNODE")
_ERRORS = capturing("ERROR")


@dataclass(frozen=True, slots=True)
class ScannedBlock:
    """A quad block as a TriG document body (variables as reserved IRIs) and where it ends."""

    trig: str
    close: int
    has_variables: bool
    has_blank_nodes: bool
    has_labels: bool


def _variable_iri(match: re.Match[str]) -> str:
    before, name = match.groups()
    return before if name is None else f"{before}<{VAR_IRI}{name[1:]}>"


def scan_block(text: str, open_offset: int, *, allow_vars: bool, allow_bnodes: bool) -> ScannedBlock | None:
    """The quad block whose `{` is at `open_offset`, or None when this scan cannot vouch for it.

    None is not an error: the caller parses the request the slow way, which accepts or rejects it.
    """
    parts: list[str] = []
    flags: set[str] = set()

    def run(start: int) -> int:
        """Offset of the first brace or unexpected character from `start`, noting flags on the way."""
        position = start
        while True:
            position = _BLOCK_RUN.match(text, position).end()  # type: ignore[union-attr]
            char = text[position : position + 1]
            if char == "?" or char == "$":
                flags.add("var")
            elif char == "[" or char == "(":
                flags.add("anonymous")
            elif char == "#":
                flags.add("comment")
                position = _COMMENT.match(text, position).end() - 1  # type: ignore[union-attr]
            elif char == "_":  # only "_:" stops a run
                flags.add("label")
                position += 1
            else:
                return position
            position += 1

    def segment(start: int, end: int) -> None:
        body = text[start:end]
        if body and not body.isspace():
            parts.append(f"{{{body}\n}}")

    segment_start = position = open_offset + 1
    while True:
        position = run(position)
        char = text[position : position + 1]
        if char == "}":
            segment(segment_start, position)
            break
        if char != "{":
            return None
        tail = _GRAPH_TAIL.search(text, segment_start, position)
        if tail is None:
            return None
        graph_start = tail.start()
        if graph_start != segment_start and not text[graph_start - 1].isspace():
            return None
        if "comment" in flags and "#" in text[text.rfind("\n", 0, graph_start) + 1 : graph_start]:
            return None  # GRAPH might be commented out: let the tokenizer tell
        segment(segment_start, graph_start)
        end = run(position + 1)
        if text[end : end + 1] != "}":
            return None
        parts.append(text[graph_start : end + 1])
        position = end + 1
        dot = _DOT.match(text, position)
        if dot is not None:
            position = dot.end()
        segment_start = position
    if ("var" in flags and not allow_vars) or (("label" in flags or "anonymous" in flags) and not allow_bnodes):
        return None
    trig = "\n".join(parts)
    if "var" in flags:
        trig = _VARIABLES.sub(_variable_iri, trig)
    return ScannedBlock(trig, position, "var" in flags, bool(flags & {"label", "anonymous"}), "label" in flags)


def blank_node_labels(text: str, start: int, end: int) -> set[str]:
    """The blank node labels (`_:b1`) of text[start:end], cut as the tokenizer would cut them."""
    return set(_LABELS.findall(text, start, end)) - {""}


def group_end(text: str, open_offset: int) -> int | None:
    """Offset of the `}` closing the group at `open_offset` (a WHERE clause), or None if unsure.

    Also None when the tokenizer would find an unexpected character in the group, so pyoxigraph's
    query parser never accepts what the tokenizing parser rejects.
    """
    depth = 0
    position = open_offset
    while True:
        char = text[position : position + 1]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                break
        else:
            return None
        position = _GROUP_RUN.match(text, position + 1).end()
    if any(_ERRORS.findall(text, open_offset, position + 1)):
        return None
    return position
