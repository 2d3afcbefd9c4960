"""What every worker process does with the engine's messages: receive them, and load its replica from
a ``seed``. Apart from :mod:`broker.workers.replica` so that a BOOSTER worker
(:mod:`broker.workers.booster`) imports neither the query nor the update path: those imports (the
update parser's regular expressions, compiled at import) were half its CPU time: importing
broker.workers.booster took 0.56-0.65 s of user time before, 0.23-0.33 s after.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from pyoxigraph import Store

from broker.store import RdfStore, graph_named, load_keeping_labels, load_slices

PR_SET_PDEATHSIG = 1


def seeded(message: tuple[Any, ...], connection: Connection | None = None) -> RdfStore:
    """The replica a ``seed`` message describes: N-Quads and named graphs, or a checkpoint directory.
    N-Quads of None follow the message raw on `connection`, in slices ended by an empty one
    (:class:`broker.workers.pool.Worker` sends them so: pickling 122 MB held the gateway's GIL 70
    ms), each run of whole lines loaded as it comes (:func:`broker.store.load_slices`): received
    whole first, the 39 MB of a 231,100-quad store were held beside the replica being loaded.

    Loaded by :func:`broker.store.load_keeping_labels`, which keeps blank node labels (the deltas
    name the same nodes) and parses in Rust the lines without one: 1.3 million quads (122 MB) in
    3.8 s on the test machine, where `parse` and `bulk_extend` made a Python object of each quad
    and took 6.2 s."""
    _, kind, payload, graphs = message[:4]
    if kind == "directory":
        return RdfStore(Store(payload))
    store = Store()
    if payload is None:
        assert connection is not None
        load_slices(iter(connection.recv_bytes, b""), store, background=False)
    elif payload:
        load_keeping_labels(payload, store, background=False)
    for graph in graphs:
        store.add_graph(graph_named(graph))
    return RdfStore(store)


def seeded_quads(message: tuple[Any, ...], store: RdfStore) -> int:
    """How many quads `store`, :func:`seeded` from `message`, holds: the gateway's count when the
    seed carries it (a checkpoint of a RocksDB store not changed since its count at open,
    :meth:`broker.store.RdfStore.backup`), else counted, a full scan of the replica."""
    told: int | None = message[4] if len(message) > 4 else None
    return len(store.ox) if told is None else told


def received(connection: Connection, wait_s: Callable[[], float | None] = lambda: None) -> Iterator[tuple[Any, ...]]:
    """The broker's messages, until it closes its end (a worker's serving loop); ``("idle",)`` when
    none came within `wait_s()` seconds (None: wait for one)."""
    while True:
        try:
            timeout = wait_s()
            if timeout is not None and not connection.poll(timeout):
                yield ("idle",)
                continue
            yield connection.recv()
        except (EOFError, OSError):
            return
