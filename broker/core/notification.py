"""The notification a subscription receives: added and removed results since the previous one."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from pyoxigraph import NamedNode, Quad

from broker.errors import SepaError
from broker.sparql.syntax import Digest
from broker.sparql.terms import (
    CACHED_TEXT_MAX,
    TEXT_CACHE_SIZE,
    Row,
    TooLarge,
    bindings_json_text,
    row_json_text,
    rows_to_bindings,
)
from broker.workers.codec import rows_from_tsv


class LazyRows(Sequence[Row]):
    """Rows built only when read (:meth:`rows`, cached by the subclass); a sequence like a tuple
    of them, and equal to one."""

    __slots__ = ()

    def rows(self) -> tuple[Row, ...]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows())

    @overload
    def __getitem__(self, index: int) -> Row: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Row, ...]: ...

    def __getitem__(self, index: int | slice) -> Row | tuple[Row, ...]:
        return self.rows()[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyRows):
            return self.rows() == other.rows()
        if isinstance(other, tuple):
            return self.rows() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to a tuple, so unhashable like a list

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.rows()!r})"


class QuadRows(LazyRows):
    """A graph feed's rows (broker.core.spu.GraphFeedSpu): one per quad of `graph` among `source`,
    the quad's terms in `order` (0 subject, 1 predicate, 2 object) — built only when read.

    Why lazy: a notification of an observation batch carries ~11 quads per observation, and building
    a row of three terms per quad on the update thread cost more than everything else the cloud
    shipper does (each first touch of a delta quad is a cache miss; thousands of live row tuples
    also wake the garbage collector). Here the engine pays nothing per quad: it hands over the
    update's own (immutable) set of quads, and a consumer either reads rows like any others or,
    in process, walks :meth:`quads` once and takes only the terms it needs.

    `graph` None means every quad of `source` is in the graph. Truth is decided by the first quad
    of the graph found (an observation batch: the first one), the length by a full count.

    `digest`: the producer's account of these quads when the update was an Update syntax tree that added
    every quad it inserts into this graph (see broker.sparql.syntax), else None; `instant_us` is
    then the update's engine-clock instant (what fn:now() returned during it), which the producer
    could not know.
    Rows and quads are the same either way: a consumer that does not know the digest ignores it.
    """

    __slots__ = ("source", "graph", "order", "digest", "instant_us", "_rows")

    def __init__(
        self,
        source: Collection[Quad],
        graph: NamedNode | None,
        order: tuple[int, ...],
        digest: Digest | None = None,
        instant_us: int | None = None,
    ) -> None:
        self.source = source
        self.graph = graph
        self.order = order
        self.digest = digest
        self.instant_us = instant_us
        self._rows: tuple[Row, ...] | None = None

    def quads(self) -> Iterator[Quad]:
        """The quads of the graph, in one pass over the source (nothing is kept)."""
        graph = self.graph
        if graph is None:
            return iter(self.source)
        return (quad for quad in self.source if quad.graph_name == graph)

    def rows(self) -> tuple[Row, ...]:
        if self._rows is None:
            order = self.order
            rows = []
            for quad in self.quads():
                terms = (quad.subject, quad.predicate, quad.object)
                rows.append(tuple(terms[index] for index in order))
            self._rows = tuple(rows)
        return self._rows

    def __bool__(self) -> bool:
        if self._rows is not None:
            return bool(self._rows)
        return next(self.quads(), None) is not None

    def __len__(self) -> int:
        return len(self.rows())


_line_texts: dict[bytes, dict[bytes, str]] = {}  # by header line: by row line, its SPARQL JSON


class TsvRows(LazyRows):
    """A re-evaluated subscription's rows as lines of SPARQL TSV (`head`, the header line, and one
    line per row, no empty line), read into terms only when read.

    Why lazy: a query worker writes a re-evaluation as TSV (broker.workers.jobs), and a network
    subscriber only needs the rows as SPARQL JSON, which is written from a cache of texts per line
    (the same rows come back subscription after subscription). Reading 1,000 rows into terms cost
    the update thread 0.85 ms and sharing them as much again; 1,000 such subscriptions of 1,000
    rows spent 45 % of the update thread's time subscribing there (py-spy, `bench reeval --rows
    1000`). An in-process subscriber reads rows like any others.
    """

    __slots__ = ("head", "lines", "_rows")

    def __init__(self, head: bytes, lines: list[bytes]) -> None:
        self.head = head
        self.lines = lines
        self._rows: tuple[Row, ...] | None = None

    def rows(self) -> tuple[Row, ...]:
        if self._rows is None:
            self._rows = rows_from_tsv(self.head + b"\n" + b"".join(line + b"\n" for line in self.lines))
        return self._rows

    def json_text(self, variables: tuple[str, ...], limit: int | None = None) -> str:
        """``bindings_json_text(variables, self, limit)``, from the texts of lines written before (one
        dict per header: a lookup per line in C; 1,000 lines: ~0.05 ms)."""
        texts = _line_texts.get(self.head)
        if texts is None or len(texts) >= TEXT_CACHE_SIZE:
            if len(_line_texts) >= 64:
                _line_texts.clear()
            texts = _line_texts[self.head] = {}
        try:
            return _joined(list(map(texts.__getitem__, self.lines)), limit)
        except KeyError:
            pass
        missing = [line for line in self.lines if line not in texts]
        if sum(map(len, _line_texts.values())) + len(missing) > TEXT_CACHE_SIZE:
            # all headers together: bounded per header only, 64 headers of 32,768 texts each could
            # hold ~1 GB on a board of 1 GB (re-evaluated subscriptions of many variable lists)
            _line_texts.clear()
            texts = _line_texts[self.head] = {}
            missing = self.lines  # those it had are gone with it
        rows = rows_from_tsv(self.head + b"\n" + b"".join(line + b"\n" for line in missing))
        written = {}
        for line, row in zip(missing, rows, strict=True):
            text = written[line] = row_json_text(variables, row)
            if len(text) <= CACHED_TEXT_MAX:
                texts[line] = text
        return _joined([texts.get(line) or written[line] for line in self.lines], limit)

    def __bool__(self) -> bool:
        return bool(self.lines)

    def __len__(self) -> int:
        return len(self.lines)


def _joined(texts: list[str], limit: int | None) -> str:
    """The bindings array of these row texts; :class:`TooLarge` past `limit` characters."""
    if limit is not None and sum(map(len, texts)) + 2 * len(texts) > limit:
        raise TooLarge(limit)
    return "[" + ", ".join(texts) + "]"


def _bindings_text(variables: tuple[str, ...], rows: Sequence[Row], limit: int | None) -> str:
    if isinstance(rows, TsvRows):
        return rows.json_text(variables, limit)
    return bindings_json_text(variables, rows, limit)


@dataclass(frozen=True, slots=True)
class Notification:
    """One notification of one subscription (PROTOCOL.md "Notification semantics").

    SELECT subscriptions carry `added` / `removed` rows (tuples of terms in `variables` order,
    None where unbound; a graph feed's are a :class:`QuadRows`, a re-evaluation's may be a
    :class:`TsvRows`). ASK subscriptions carry `boolean`
    (the new value) and `previous`; their rows are empty.
    """

    spuid: str
    alias: str | None
    sequence: int
    variables: tuple[str, ...]
    added: Sequence[Row] = ()
    removed: Sequence[Row] = ()
    boolean: bool | None = None
    previous: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    # the subscription ended here, for this reason (its re-evaluation ran past the time limit...)
    ended: SepaError | None = None

    def results(self, rows: Sequence[Row], boolean: bool | None) -> dict[str, Any]:
        if self.boolean is not None:
            return {"head": {}} if boolean is None else {"head": {}, "boolean": boolean}
        return {"head": {"vars": list(self.variables)}, "results": {"bindings": rows_to_bindings(self.variables, rows)}}

    def to_json(self) -> dict[str, Any]:
        """The wire form: `{"notification": {...}}` exactly as PROTOCOL.md shows it."""
        body: dict[str, Any] = {"spuid": self.spuid, "alias": self.alias, "sequence": self.sequence}
        if self.boolean is not None:
            # sequence 0's removed results are the empty result, whose ASK is false: the same shape
            # as every later notification's (a client reads `removedResults.boolean` in each)
            body["addedResults"] = self.results((), self.boolean)
            body["removedResults"] = self.results((), bool(self.previous) if self.sequence else False)
        else:
            body["addedResults"] = self.results(self.added, None)
            body["removedResults"] = self.results(self.removed, None)
        return {"notification": body}

    def to_json_text(self, limit: int | None = None) -> str:
        """``json.dumps(self.to_json())``, the bindings written from cached term texts
        (:func:`broker.sparql.terms.bindings_json_text`: 8-50x faster on a 1,000-row result).

        `limit`: :class:`broker.sparql.terms.TooLarge` once the rows pass that many characters
        (added and removed together), before the rest is written."""
        if self.boolean is not None:
            return json.dumps(self.to_json())
        head = '{"head": {"vars": ' + json.dumps(list(self.variables)) + '}, "results": {"bindings": '
        added_rows = _bindings_text(tuple(self.variables), self.added, limit)
        removed_rows = _bindings_text(
            tuple(self.variables), self.removed, None if limit is None else limit - len(added_rows)
        )
        added = head + added_rows + "}}"
        removed = head + removed_rows + "}}"
        return (
            f'{{"notification": {{"spuid": {json.dumps(self.spuid)}, "alias": {json.dumps(self.alias)}, '
            f'"sequence": {json.dumps(self.sequence)}, "addedResults": {added}, "removedResults": {removed}}}}}'
        )
