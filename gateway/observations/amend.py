"""Quads added to a batch's observation update, in the same atomic request (delivery records).

Why in the batch's one operation when it can be: the observations' update is a single Modify whose
WHERE has one solution (gateway/observations/quads.py); ground quads added to its templates are
written once, and the engine keeps its fast path. Two more operations would make it a sequence of
operations, the slow path. A batch sent as SPARQL text gets DELETE DATA / INSERT DATA after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pyoxigraph import Quad

from broker.api import DeleteData, InsertData, Modify, Update


def with_quads(request: Update | str, added: Sequence[Quad], deleted: Sequence[Quad]) -> Update | str:
    """`request` that also inserts `added` and deletes `deleted` (ground quads)."""
    if not added and not deleted:
        return request
    if isinstance(request, Update) and len(request.operations) == 1 and isinstance(request.operations[0], Modify):
        operation = request.operations[0]
        widened = replace(operation, delete=(*operation.delete, *deleted), insert=(*operation.insert, *added))
        return replace(request, operations=(widened,))
    operations = [DeleteData(tuple(deleted))] if deleted else []
    operations += [InsertData(tuple(added))] if added else []
    text = request if isinstance(request, str) else request.to_sparql()
    return text + " ;\n" + Update(tuple(operations)).to_sparql()
