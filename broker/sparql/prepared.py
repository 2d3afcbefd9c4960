"""An update request an in-process producer hands over already parsed.

A batch of sensor readings is thousands of quads. Written as SPARQL only for the engine to parse
it back, the text cost more than everything else the engine does with the batch (parsing ~45 %
of Engine.update on 500-reading batches). A producer that holds the engine's own objects can
instead give the operations the parser would have produced: they go through the scheduler and
the update processor like parsed text (same evaluation, same exact delta, same engine clock), only
the parse is skipped. Transports that send text (the network) ask for `sparql()`, which renders
the same request.

The producer answers for the operations being what its text parses to (the observation layer's
tests check it quad for quad); the engine cannot check that without parsing, the cost avoided.

A producer may also give a `digest`: its own account of the quads the request inserts into
`digest_graph` (the observation layer: one flat record per observation), for in-process consumers
of that graph's feed, which would otherwise read every quad back (reading a fresh pyoxigraph quad's
terms from Python costs more than building it). The engine never looks inside a digest; it hands
it to the graph's feeds only when none of those quads was stored already, i.e. the update added all
of them, so that whatever the digest says of them is true of the delta. Otherwise feeds carry no
digest and consumers read the quads, as they do for any other update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyoxigraph import NamedNode

from broker.sparql.update_parser import Operation


@dataclass(frozen=True, slots=True)
class PreparedUpdate:
    """`operations` as `parse_update(render()).operations` would give them; `render` makes the text
    only when a transport needs it (and must not depend on state that changes after the call).
    `digest`, `digest_graph`: see the module docstring."""

    operations: tuple[Operation, ...]
    render: Callable[[], str]
    digest: object | None = None
    digest_graph: NamedNode | None = None

    def sparql(self) -> str:
        """The same request as SPARQL 1.1 Update text."""
        return self.render()
