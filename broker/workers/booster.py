"""A BOOSTER worker's process (parallel mode): a replica of the store that finds the solutions an
update's changed quads gain or lose.

Run as ``python -m broker.workers.booster FD``: FD is its end of a socket pair to the engine
(:mod:`broker.core.pipeline`). It receives, in order: one snapshot (``seed``, as a query worker's,
:func:`broker.workers.replica.seeded`), the shape groups of the subscriptions (``group``,
``ungroup``), the store's deltas (``apply``, :func:`broker.workers.pool.batched`), and jobs
(``boost``): the deltas before the update, the hits of its removed quads, its own delta, the hits
of its added quads. A job's removed hits are evaluated on the replica before the update's delta
and its added hits after (seed 001 §III-C: the pre and post phases), and answered with the
solutions of each hit, as codes (:mod:`broker.workers.codec`); the engine routes them to the SPUs,
keeps their counts and notifies. Nothing else lives here: no subscription, no callback, no count.

Why processes: the BOOSTER is index lookups and joins in Python (:mod:`broker.core.bgp`), which
hold the GIL; threads would take turns on one core.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from pyoxigraph import NamedNode, Quad, RdfFormat, parse

from broker.compaction import Compactor
from broker.core.spu import IncrementalSpu, Mu, ShapeGroup
from broker.scheduler import WORKER_STACK_BYTES
from broker.store import RdfStore
from broker.workers.codec import Code, Decoder, encode_all
from broker.workers.replica import PR_SET_PDEATHSIG, seeded

# one job's hits for one (group, branch, pattern): each quad by its index in the update's removed or
# added quads, with the number of the one SPU it concerns, or None for every SPU of the group
Item = tuple[int, int, int, list[tuple[int, int | None]]]
# one notification of one SPU: its number, rows added and removed (as codes), boolean and previous (ASK)
Notice = tuple[int, list[tuple[Code, ...]], list[tuple[Code, ...]], bool | None, bool | None]


def apply_steps(store: RdfStore, steps: list[tuple[bytes, bytes, tuple[str, ...], tuple[str, ...]]]) -> None:
    """Apply deltas sent as N-Quads (:func:`broker.workers.pool.batched`), in order."""
    for added, removed, created, dropped in steps:
        store.apply(
            parse(added, format=RdfFormat.N_QUADS) if added else (),
            parse(removed, format=RdfFormat.N_QUADS) if removed else (),
            [NamedNode(graph) for graph in created],
            [NamedNode(graph) for graph in dropped],
        )


class Notices:
    """Stands for an SPU's subscribers here: keeps what the SPU notifies, for the engine."""

    def __init__(self, sid: int, outbox: list[Notice]) -> None:
        self.sid = sid
        self.outbox = outbox

    def emit(self, added: Any, removed: Any, boolean: bool | None, previous: bool | None) -> None:
        encoded = [encode_all(row) for row in added], [encode_all(row) for row in removed]
        self.outbox.append((self.sid, *encoded, boolean, previous))


class Booster:
    """The replica, the shape groups with their SPUs (their counts live here), and one job's work."""

    def __init__(self, store: RdfStore) -> None:
        self.store = store
        self.groups: dict[int, ShapeGroup] = {}
        self.spus: dict[int, IncrementalSpu] = {}
        self.decoder = Decoder()
        self.compactor = Compactor(store)
        self.outbox: list[Notice] = []

    def add_spu(self, sid: int, gid: int, params: tuple[tuple[Code, ...], ...]) -> None:
        """A new SPU, evaluated on the replica as it is now (the engine sent every delta before)."""
        group = self.groups[gid]
        values = tuple(self.decoder.terms(branch) for branch in params)
        spu = IncrementalSpu(group, values)
        spu.load(self.store)
        spu.subscribers.append(Notices(sid, self.outbox))  # type: ignore[arg-type]
        group.spus[values] = spu
        for index, branch in enumerate(values):
            group.routes[index].setdefault(branch, set()).add(spu)
        self.spus[sid] = spu

    def drop_spu(self, sid: int) -> None:
        spu = self.spus.pop(sid)
        group = spu.group
        group.spus.pop(spu.params, None)
        for index, branch in enumerate(spu.params):
            routed = group.routes[index].get(branch)
            if routed is not None:
                routed.discard(spu)
                if not routed:
                    del group.routes[index][branch]

    def collect(self, items: list[Item], quads: list[Quad], out: dict[IncrementalSpu, dict[int, set[Mu]]]) -> None:
        for gid, branch, pattern, hits in items:
            entries = [(quads[index], None if sid is None else {self.spus[sid]}) for index, sid in hits]
            self.groups[gid].collect(self.store, (branch, pattern), entries, out)  # type: ignore[arg-type]

    def boost(self, message: tuple[Any, ...]) -> tuple[Any, ...]:
        """Pre phase, the update's delta, post phase, then fold and notify (seed 001 §III-C)."""
        _, micros, before, removed_items, delta, added_items = message
        apply_steps(self.store, before)
        added_bytes, removed_bytes, _, _ = delta[0]
        removed = list(parse(removed_bytes, format=RdfFormat.N_QUADS)) if removed_bytes else []
        added = list(parse(added_bytes, format=RdfFormat.N_QUADS)) if added_bytes else []
        clock = self.store.clock
        clock.pin(micros)  # FILTERs with NOW() see the instant the engine gave the update
        lost: dict[IncrementalSpu, dict[int, set[Mu]]] = {}
        gained: dict[IncrementalSpu, dict[int, set[Mu]]] = {}
        try:
            started = time.perf_counter()
            self.collect(removed_items, removed, lost)
            apply_steps(self.store, delta)
            self.collect(added_items, added, gained)
            for spu in lost.keys() | gained.keys():
                spu.apply(lost.get(spu, {}), gained.get(spu, {}))
            seconds = time.perf_counter() - started
        except Exception as error:  # noqa: BLE001 - reported to the engine, which logs it
            return ("failed", f"{type(error).__name__}: {str(error)[:300]}")
        finally:
            clock.unpin()
            notices, self.outbox[:] = list(self.outbox), []
        self.compactor.maybe_compact()
        return ("boosted", notices, seconds)


def serve(connection: Connection) -> None:
    """Follow the store and answer jobs until the engine closes its end."""
    booster: Booster | None = None
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        kind = message[0]
        if kind == "boost":
            assert booster is not None
            connection.send(booster.boost(message))
        elif kind == "apply":
            assert booster is not None
            apply_steps(booster.store, message[1])
            booster.compactor.maybe_compact()
        elif kind == "group":
            assert booster is not None
            _, gid, arguments = message
            booster.groups[gid] = ShapeGroup(*arguments)
        elif kind == "ungroup":
            assert booster is not None
            booster.groups.pop(message[1], None)
        elif kind == "spu":
            assert booster is not None
            booster.add_spu(*message[1:])
        elif kind == "unspu":
            assert booster is not None
            booster.drop_spu(message[1])
        elif kind == "seed":
            booster = Booster(seeded(message))
            connection.send(("ready",))


def main() -> None:
    with contextlib.suppress(OSError, AttributeError):  # die with the engine, even when it is killed
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is for the gateway to handle
    sock = socket.socket(fileno=int(sys.argv[1]))
    connection = Connection(sock.detach())
    threading.stack_size(WORKER_STACK_BYTES)  # FILTERs evaluate as deep as in the engine's threads
    thread = threading.Thread(target=serve, args=(connection,), name="sepa-booster")
    thread.start()
    thread.join()


if __name__ == "__main__":
    main()
