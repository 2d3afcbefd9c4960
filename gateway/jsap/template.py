"""A JSAP SPARQL template: where each forced-binding variable sits, and how to replace it.

The SEPA clients replace `?var` by plain text search, which also rewrites `?var` inside a string
or an IRI and produces invalid SPARQL when the variable is projected. Here the template is
tokenized once, at load time (broker.sparql.tokens: strings, IRIs and comments are single
tokens, `?x` and `$x` are the same variable), and each occurrence of a forced variable gets a
*slot kind* that says what may be written there:

* `term`: anywhere a term is valid (triple patterns, templates, expressions, `GRAPH ?g`): the
  term itself.
* `project`: a bare variable in a SELECT projection, where a constant is not allowed: written
  `(<term> AS ?x)`, so the result keeps its column and every row carries the bound value (the
  subscription's `vars` do not depend on the binding). `SELECT *` cannot name it: there the
  variable simply disappears from the results, as with the Java client. If a subquery nested in
  that SELECT also projects `?x` (rewritten to `(<term> AS ?x)` itself), the outer `?x` is kept
  bare: it is in scope, and re-assigning it would be an error.
* `wrap`: a bare variable in a GROUP BY / ORDER BY condition list, where only an expression in
  brackets is allowed: written `(<term>)`.

Two places cannot take a term at all and make the JSAP invalid when they hold a forced variable:
the target of `AS` (in BIND, a projection or GROUP BY) and a VALUES header.

Every replacement is padded with a space where it touches other text, so it can never fuse with
a neighbouring token (`?x.ex:o` with a blank node must not become the label `_:b.ex`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from broker.api import SparqlSyntaxError, Token, line_column, matching_brace, tokenize

_ORDER_TERMINATORS = frozenset({"HAVING", "ORDER", "LIMIT", "OFFSET", "VALUES", "GROUP"})


class TemplateError(ValueError):
    """A template that cannot take its forced bindings; `variable` is the one at fault, if any."""

    def __init__(self, detail: str, variable: str | None = None) -> None:
        super().__init__(detail)
        self.variable = variable


@dataclass(frozen=True)
class Slot:
    """One occurrence of a forced variable: characters [start, end) of the template."""

    start: int
    end: int
    name: str
    token: str  # the variable as written (`?x` or `$x`)
    kind: str  # "term" | "project" | "wrap"
    insertable: bool  # inside an INSERT DATA / INSERT / CONSTRUCT template (a blank node may go there)
    line: int
    column: int


@dataclass(frozen=True)
class Template:
    """A tokenized SPARQL template, ready to be rendered with terms for its forced variables."""

    text: str
    declared_prefixes: Mapping[str, str]  # PREFIX declarations already in the text
    used_prefixes: frozenset[str]  # prefixes of the prefixed names the text uses
    slots: tuple[Slot, ...]

    def slots_of(self, name: str) -> tuple[Slot, ...]:
        return tuple(slot for slot in self.slots if slot.name == name)

    def render(self, terms: Mapping[str, str], prologue: str = "") -> str:
        """`prologue` followed by the text with every slot replaced by the SPARQL text of its term."""
        text = self.text
        out = [prologue]
        position = 0
        for slot in self.slots:
            term = terms[slot.name]
            if slot.kind == "project":
                replacement = f"({term} AS {slot.token})"
            elif slot.kind == "wrap":
                replacement = f"({term})"
            else:
                replacement = term
            if slot.start > 0 and not text[slot.start - 1].isspace():
                replacement = " " + replacement
            if slot.end < len(text) and not text[slot.end].isspace():
                replacement += " "
            out.append(text[position : slot.start])
            out.append(replacement)
            position = slot.end
        out.append(text[position:])
        return "".join(out)


def analyse(text: str, variables: Iterable[str]) -> Template:
    """Tokenize `text` and locate every occurrence of the forced `variables`.

    Raises TemplateError on a lexical error (with line and column), on unbalanced braces around a
    template, or when a forced variable sits where no term can go.
    """
    wanted = frozenset(variables)
    try:
        tokens = tokenize(text)
    except SparqlSyntaxError as error:
        raise TemplateError(error.description) from None
    walker = _Walker(text, tokens)
    try:
        kinds, insertable = walker.slot_kinds(wanted)
    except SparqlSyntaxError as error:
        raise TemplateError(error.description) from None
    slots = []
    for index, token in enumerate(tokens):
        if token.kind != "VAR" or token.text[1:] not in wanted:
            continue
        name = token.text[1:]
        line, column = line_column(text, token.start)
        where = f"line {line}, column {column}"
        if index > 0 and tokens[index - 1].is_keyword("AS"):
            raise TemplateError(f"?{name} is assigned by AS at {where}; a forced binding cannot replace it", name)
        if index in walker.values_headers:
            raise TemplateError(f"?{name} is declared by VALUES at {where}; a forced binding cannot replace it", name)
        kind = kinds.get(index, "term")
        if kind == "keep":
            continue
        slots.append(
            Slot(token.start, token.start + len(token.text), name, token.text, kind, index in insertable, line, column)
        )
    return Template(text, walker.declared_prefixes(), walker.used_prefixes(), tuple(slots))


class _Walker:
    """The few structural facts forced bindings need, found by scanning tokens (no full parse)."""

    def __init__(self, text: str, tokens: list[Token]) -> None:
        self.text = text
        self.tokens = tokens
        self.values_headers = self._values_headers()

    def _keyword(self, index: int, *words: str) -> bool:
        return index < len(self.tokens) and self.tokens[index].kind == "NAME" and self.tokens[index].upper in words

    def _punct(self, index: int, char: str) -> bool:
        return index < len(self.tokens) and self.tokens[index].kind == "PUNCT" and self.tokens[index].text == char

    def declared_prefixes(self) -> dict[str, str]:
        tokens = self.tokens
        declared = {}
        for index in range(len(tokens) - 2):
            if (
                self._keyword(index, "PREFIX")
                and tokens[index + 1].kind == "PNAME"
                and tokens[index + 1].text.endswith(":")
                and tokens[index + 2].kind == "IRI"
            ):
                declared[tokens[index + 1].text[:-1]] = tokens[index + 2].text[1:-1]
        return declared

    def used_prefixes(self) -> frozenset[str]:
        return frozenset(token.text.partition(":")[0] for token in self.tokens if token.kind == "PNAME")

    def _values_headers(self) -> frozenset[int]:
        headers = set()
        for index in range(len(self.tokens)):
            if not self._keyword(index, "VALUES"):
                continue
            cursor = index + 1
            if cursor < len(self.tokens) and self.tokens[cursor].kind == "VAR":
                headers.add(cursor)
            elif self._punct(cursor, "("):
                cursor += 1
                while cursor < len(self.tokens) and self.tokens[cursor].kind == "VAR":
                    headers.add(cursor)
                    cursor += 1
        return frozenset(headers)

    def _group_end(self, open_index: int) -> int:
        return matching_brace(self.tokens, open_index, self.text)

    def slot_kinds(self, wanted: frozenset[str]) -> tuple[dict[int, str], frozenset[int]]:
        """Slot kind of the token indexes that are not plain `term` slots, and the insertable indexes."""
        tokens = self.tokens
        kinds: dict[int, str] = {}
        projections: dict[int, tuple[dict[str, int], int]] = {}  # SELECT index -> (bare vars, group start)
        insertable: set[int] = set()
        for index in range(len(tokens)):
            if self._keyword(index, "SELECT"):
                projections[index] = self._projection(index)
            elif self._keyword(index, "GROUP", "ORDER") and self._keyword(index + 1, "BY"):
                for var_index in self._conditions(index + 2):
                    kinds[var_index] = "wrap"
            elif self._keyword(index, "INSERT", "CONSTRUCT"):
                cursor = index + 1
                if self._keyword(index, "INSERT") and self._keyword(cursor, "DATA"):
                    cursor += 1
                if self._punct(cursor, "{"):
                    insertable.update(range(cursor, self._group_end(cursor) + 1))
        for bare, group_start in projections.values():
            group_end = self._group_end(group_start) if group_start < len(tokens) else group_start
            for name, var_index in bare.items():
                if name not in wanted:
                    continue
                nested = any(name in projections[other][0] for other in projections if group_start < other < group_end)
                kinds[var_index] = "keep" if nested else "project"
        return kinds, frozenset(insertable)

    def _projection(self, select_index: int) -> tuple[dict[str, int], int]:
        """Bare variables of a SELECT projection (name -> token index) and where its WHERE group opens."""
        tokens = self.tokens
        cursor = select_index + 1
        if self._keyword(cursor, "DISTINCT", "REDUCED"):
            cursor += 1
        depth = 0
        bare: dict[str, int] = {}
        while cursor < len(tokens):
            token = tokens[cursor]
            if depth == 0 and (self._punct(cursor, "{") or self._keyword(cursor, "WHERE", "FROM")):
                break
            if self._punct(cursor, "("):
                depth += 1
            elif self._punct(cursor, ")"):
                depth -= 1
            elif token.kind == "VAR" and depth == 0:
                bare[token.text[1:]] = cursor
            cursor += 1
        while cursor < len(tokens) and not self._punct(cursor, "{"):
            cursor += 1
        return bare, cursor

    def _conditions(self, start: int) -> list[int]:
        """Indexes of the bare variables of a GROUP BY / ORDER BY condition list starting at `start`."""
        tokens = self.tokens
        found = []
        depth = 0
        for cursor in range(start, len(tokens)):
            token = tokens[cursor]
            if depth == 0 and (self._punct(cursor, "}") or self._keyword(cursor, *_ORDER_TERMINATORS)):
                break
            if self._punct(cursor, "("):
                depth += 1
            elif self._punct(cursor, ")"):
                depth -= 1
            elif token.kind == "VAR" and depth == 0:
                found.append(cursor)
        return found
