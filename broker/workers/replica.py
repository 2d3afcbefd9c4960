"""The query worker's process: a replica of the store that evaluates jobs, and can be killed.

Run as ``python -m broker.workers.replica FD``: FD is its end of a socket pair to the broker. It
receives, in order, one snapshot (``seed``), then the deltas the store applied (``apply``, in
order as N-Quads, :func:`broker.workers.pool.batched`) and jobs (``job``, :mod:`broker.workers.jobs`), each
answered with one reply. A job sees every delta sent before it, so it sees what the store held
when it was sent: the replica is the store, one message behind at most.

Nothing here is shared with the broker's process; a job that never ends, or crashes pyoxigraph,
costs this process only (:mod:`broker.workers.pool` kills and replaces it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

from pyoxigraph import NamedNode, RdfFormat, Store, parse

from broker.compaction import Compactor
from broker.core.query_processor import QueryProcessor
from broker.errors import SepaError
from broker.scheduler import WORKER_STACK_BYTES
from broker.store import RdfStore
from broker.workers.cpus import use_every_cpu
from broker.workers.jobs import JOBS

PR_SET_PDEATHSIG = 1
NICENESS = 10


def seeded(message: tuple[Any, ...]) -> RdfStore:
    """The replica a ``seed`` message describes: N-Quads and named graphs, or a checkpoint directory."""
    _, kind, payload, graphs = message
    if kind == "directory":
        return RdfStore(Store(payload))
    store = Store()
    if payload:
        # parse keeps blank node labels (Store.load would rename them): the deltas name the same nodes
        store.bulk_extend(parse(payload, format=RdfFormat.N_QUADS))
    for graph in graphs:
        store.add_graph(NamedNode(graph))
    return RdfStore(store)


def reply_for(processor: QueryProcessor, message: tuple[Any, ...]) -> tuple[Any, ...]:
    """Run one job; its reply: ``("ok", value)``, or the error as (kind, class name, description)."""
    _, name, args, kwargs, micros = message
    clock = processor.store.clock
    clock.pin(micros)
    try:
        return ("ok", JOBS[name](processor, *args, **kwargs))
    except SepaError as error:
        return ("sepa", type(error).__name__, error.description)
    except SyntaxError as error:
        return ("syntax", "SyntaxError", str(error))
    except Exception as error:  # noqa: BLE001 - whatever pyoxigraph raised, the broker gets one line
        return ("sepa", "InvalidRequest", f"query evaluation failed: {str(error)[:300]}")
    finally:
        clock.unpin()


def serve(connection: Connection, service_allow: tuple[str, ...]) -> None:
    """Apply deltas and answer jobs until the broker closes its end."""
    processor: QueryProcessor | None = None
    compactor: Compactor | None = None
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        kind = message[0]
        if kind == "apply":
            assert processor is not None
            for added, removed, created, dropped in message[1]:
                processor.store.apply(
                    parse(added, format=RdfFormat.N_QUADS) if added else (),
                    parse(removed, format=RdfFormat.N_QUADS) if removed else (),
                    [NamedNode(graph) for graph in created],
                    [NamedNode(graph) for graph in dropped],
                )
            assert compactor is not None
            compactor.maybe_compact()  # dead versions grow in a replica as in the store
        elif kind == "job":
            assert processor is not None
            connection.send(("started",))  # the deltas before it are applied: its time limit starts now
            connection.send(reply_for(processor, message))
        elif kind == "jobs":  # QueryWorkers.dispatch: one message for many, answered one by one
            assert processor is not None
            _, name, calls, micros = message
            for args, kwargs in calls:
                connection.send(("started",))
                connection.send(reply_for(processor, ("job", name, args, kwargs, micros)))
        elif kind == "seed":
            processor = QueryProcessor(seeded(message), service_allow=service_allow)
            compactor = Compactor(processor.store, live=len(processor.store.ox))  # one thread: 20 ms for 334k
            connection.send(("ready",))


def main() -> None:
    with contextlib.suppress(OSError, AttributeError):  # die with the broker, even when it is killed
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is for the broker to handle
    use_every_cpu()
    # below the broker: a replica catching up on 200,000 quads took both cores of the test machine
    # from ingestion (bench mqtt's p99 15 -> 190 ms); the broker's own threads come first
    os.nice(NICENESS)
    sock = socket.socket(fileno=int(sys.argv[1]))
    connection = Connection(sock.detach())
    service_allow = tuple(sys.argv[2:])
    # the evaluator recurses as deep as in the broker's engine threads: same stack size
    threading.stack_size(WORKER_STACK_BYTES)
    thread = threading.Thread(target=serve, args=(connection, service_allow), name="sepa-replica")
    thread.start()
    thread.join()


if __name__ == "__main__":
    main()
