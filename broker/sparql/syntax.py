"""The public syntax tree of a SPARQL 1.1 Update request: what an in-process producer builds.

A batch of sensor readings is thousands of quads. Written as SPARQL only for the engine to parse
it back, the text cost more than everything else the engine does with the batch (parsing ~45 %
of Engine.update on 500-reading batches). So a producer may hand the engine this tree instead of
text: the engine plans it (:func:`broker.sparql.plan.plan_update`) into the operations the parser
would have produced and applies them like parsed text (same evaluation, same exact delta, same
engine clock, same notifications). Transports that send text (the network) send
:meth:`Update.to_sparql`, which renders the same request; the tree is the contract, the text its
printout (tests/broker/sparql/test_syntax.py parses every printout back and compares deltas).

The tree covers what producers need, no more: INSERT DATA, DELETE DATA and DELETE/INSERT ... WHERE
with quad templates of pyoxigraph terms and :class:`Var`, the WHERE group kept as SPARQL text
(the query processor plans it, and caches the plan by its text).

A producer may also attach a :class:`Digest`: its own account of the quads the request inserts
into one graph (the observation layer: one flat record per observation), for in-process consumers
of that graph's feed, which would otherwise read every quad back (reading a fresh pyoxigraph quad's
terms from Python costs more than building it). The engine never looks inside a digest; it hands
it to the graph's feeds (:attr:`broker.core.notification.QuadRows.digest`) only when none of those
quads was stored already, i.e. the update added all of them, so that whatever the digest says of
them is true of the delta. Otherwise feeds carry no digest and consumers read the quads, as they
do for any other update, and any update from any client or transport.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyoxigraph import BlankNode, DefaultGraph, NamedNode, Quad

from broker.sparql.patterns import QuadPattern, Var

__all__ = ["DeleteData", "Digest", "InsertData", "Modify", "Template", "Update", "Var"]

Template = Quad | QuadPattern
"""A quad of a template: ground (a pyoxigraph Quad) or with variables (a QuadPattern of Var)."""


@dataclass(frozen=True, slots=True)
class Digest:
    """A producer's own account of the quads its update inserts into `graph`.

    Subclass it with the fields your consumers need (gateway.observations.digest); the engine only
    reads `graph`, and forwards the object as it is.
    """

    graph: NamedNode


@dataclass(frozen=True, slots=True)
class InsertData:
    """INSERT DATA: ground quads (blank nodes are renamed, fresh, each time the request runs)."""

    quads: tuple[Quad, ...]

    def to_sparql(self) -> str:
        return f"INSERT DATA {{ {_block(self.quads)} }}"


@dataclass(frozen=True, slots=True)
class DeleteData:
    """DELETE DATA: ground quads without blank nodes."""

    quads: tuple[Quad, ...]

    def to_sparql(self) -> str:
        return f"DELETE DATA {{ {_block(self.quads)} }}"


@dataclass(frozen=True, slots=True)
class Modify:
    """DELETE { delete } INSERT { insert } WHERE where.

    Templates are instantiated once per solution of `where` (a group graph pattern as SPARQL text,
    braces included); a ground template (a pyoxigraph Quad) is added or removed once if there is any
    solution, as it is. A blank node in a ground template is therefore that very node, not a fresh
    one per solution as in SPARQL text, which cannot say this: :meth:`to_sparql` refuses it. For
    fresh nodes write a Var bound in `where` (``BIND(BNODE() AS ?b)``).
    """

    delete: tuple[Template, ...] = ()
    insert: tuple[Template, ...] = ()
    where: str = "{}"

    def __post_init__(self) -> None:
        if not self.where.lstrip().startswith("{") or not self.where.rstrip().endswith("}"):
            raise ValueError("Modify.where is a group graph pattern: '{ ... }'")

    def to_sparql(self) -> str:
        parts = []
        if self.delete:
            parts.append(f"DELETE {{ {_block(self.delete, template=True)} }}")
        if self.insert:
            parts.append(f"INSERT {{ {_block(self.insert, template=True)} }}")
        if not parts:
            parts.append("DELETE { }")
        return f"{' '.join(parts)} WHERE {self.where}"


Operation = InsertData | DeleteData | Modify


@dataclass(frozen=True, slots=True)
class Update:
    """An update request: its operations, applied in order as one atomic request, and an optional
    :class:`Digest` (see the module docstring)."""

    operations: tuple[Operation, ...]
    digest: Digest | None = None

    def to_sparql(self) -> str:
        """The same request as SPARQL 1.1 Update text (what a network transport sends)."""
        return " ;\n".join(operation.to_sparql() for operation in self.operations)


def _terms(template: Template) -> tuple[object, ...]:
    if isinstance(template, Quad):
        return (template.subject, template.predicate, template.object, template.graph_name)
    return template.positions()


def _block(templates: tuple[Template, ...], *, template: bool = False) -> str:
    """Templates as a quad block: default-graph triples first, then one GRAPH group per graph."""
    default: list[str] = []
    graphs: dict[str, list[str]] = {}
    for item in templates:
        subject, predicate, object_, graph = _terms(item)
        if template and isinstance(item, Quad) and any(isinstance(t, BlankNode) for t in (subject, object_, graph)):
            raise ValueError("a blank node in a ground Modify template has no SPARQL text: use a Var bound in WHERE")
        triple = f"{subject} {predicate} {object_} ."
        if isinstance(graph, DefaultGraph):
            default.append(triple)
        else:
            graphs.setdefault(str(graph), []).append(triple)
    groups = [f"GRAPH {graph} {{ {' '.join(triples)} }}" for graph, triples in graphs.items()]
    return " ".join(default + groups)
