"""Plans a public update syntax tree (broker.sparql.syntax) into the engine's operations.

The same operations the parser builds from the tree's text (tests/broker/sparql/test_syntax.py),
without the text: one pass that splits each template into ground quads (instantiated once) and
patterns with variables. The WHERE group becomes the `SELECT *` query the parser would have made.
"""

from __future__ import annotations

from pyoxigraph import BlankNode, Quad

from broker.errors import InvalidRequest
from broker.sparql.operations import DataOp, ModifyOp, Operation
from broker.sparql.patterns import QuadPattern
from broker.sparql.syntax import DeleteData, InsertData, Modify, Template, Update


def plan_update(update: Update) -> list[Operation]:
    """The engine operations of `update`, in order."""
    operations: list[Operation] = []
    for operation in update.operations:
        if isinstance(operation, InsertData):
            operations.append(DataOp(True, tuple(operation.quads)))
        elif isinstance(operation, DeleteData):
            operations.append(DataOp(False, tuple(operation.quads)))
        elif isinstance(operation, Modify):
            delete, delete_ground = _split(operation.delete)
            insert, insert_ground = _split(operation.insert)
            operations.append(
                ModifyOp(
                    delete,
                    insert,
                    f"SELECT * WHERE {operation.where}",
                    None,
                    (),
                    None,
                    (),
                    (),
                    delete_ground=delete_ground,
                    insert_ground=insert_ground,
                )
            )
        else:
            raise TypeError(f"not an update operation: {type(operation).__name__}")
    return operations


def _split(templates: tuple[Template, ...]) -> tuple[tuple[QuadPattern, ...], tuple[Quad, ...]]:
    patterns: list[QuadPattern] = []
    ground: list[Quad] = []
    for template in templates:
        if isinstance(template, Quad):
            if isinstance(template.subject, BlankNode) or isinstance(template.object, BlankNode):
                raise InvalidRequest("blank nodes in a Modify template: use a variable bound in WHERE")
            ground.append(template)
        elif template.variables():
            patterns.append(template)
        else:
            ground.append(Quad(*template.positions()))  # type: ignore[arg-type]
    return tuple(patterns), tuple(ground)
