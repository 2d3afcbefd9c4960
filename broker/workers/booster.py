"""A BOOSTER worker's process (parallel mode): a replica of the store that finds the solutions an
update's changed quads gain or lose.

Run as ``python -m broker.workers.booster FD``: FD is its end of a socket pair to the engine
(:mod:`broker.core.pipeline`). It receives, in order: one snapshot (``seed``, as a query worker's,
:func:`broker.workers.seeding.seeded`), the shape groups of the subscriptions (``group``,
``ungroup``) and which parameter values have SPUs (``want``), the store's deltas (``apply``,
:func:`broker.workers.pool.batched`), and jobs (``boost``): the deltas before the update, the hits
of its removed quads, its own delta, the hits of its added quads. The removed hits are evaluated on
the replica before the update's delta and the added ones after it (seed 001 §III-C: the pre and
post phases); the answer is each hit's solutions that some SPU wants, as codes
(:mod:`broker.workers.codec`). The engine routes them to its SPUs, folds and notifies: the counts,
the subscriptions and their callbacks stay there.

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
from collections import Counter
from multiprocessing.connection import Connection
from typing import Any

from pyoxigraph import Quad, RdfFormat, parse

from broker.compaction import Compactor
from broker.core.held import row_weight
from broker.core.spu import ShapeGroup
from broker.sparql.limits import WORKER_STACK_BYTES
from broker.store import RdfStore, graph_named
from broker.workers.codec import OVER, TIMED_OUT, Answers, Code, Decoder, Item, encode_all
from broker.workers.cpus import use_every_cpu
from broker.workers.seeding import PR_SET_PDEATHSIG, received, seeded, seeded_quads


def apply_steps(store: RdfStore, steps: list[tuple[bytes, bytes, tuple[str, ...], tuple[str, ...]]]) -> None:
    """Apply deltas sent as N-Quads (:func:`broker.workers.pool.batched`), in order."""
    for added, removed, created, dropped in steps:
        store.apply_nquads(added, removed, created, dropped)


class Booster:
    """The replica, the shape groups, which parameter values have SPUs, and one job's work."""

    def __init__(self, store: RdfStore, quads: int) -> None:
        """`quads`: how many `store` holds (:func:`broker.workers.seeding.seeded_quads`)."""
        self.store = store
        self.groups: dict[int, ShapeGroup] = {}
        # per group, per branch: the parameter values some SPU has (how many SPUs), to drop here the
        # solutions no SPU wants (a coarse pattern's hits mostly concern nobody: seed 001 Fig. 7)
        self.wanted: dict[int, list[Counter[tuple[object, ...]]]] = {}
        self.decoder = Decoder()
        # told how many quads it holds (20 ms for 334k); started by `serve`, on a thread of its own
        self.compactor = Compactor(store, live=quads)
        self.deadline = float("inf")  # of the job at work, for the hits of bounded groups (see boost)

    def add_group(self, gid: int, arguments: tuple[Any, ...]) -> None:
        group = self.groups[gid] = ShapeGroup(*arguments)
        self.wanted[gid] = [Counter() for _ in group.shape.branches]

    def drop_group(self, gid: int) -> None:
        self.groups.pop(gid, None)
        self.wanted.pop(gid, None)

    def want(self, gid: int, params: tuple[tuple[Code, ...], ...], change: int) -> None:
        """An SPU with these parameter values (per branch) came (`change` 1) or went (-1)."""
        for branch, values in zip(self.wanted[gid], params, strict=True):
            key = self.decoder.terms(values)
            branch[key] += change
            if branch[key] <= 0:
                del branch[key]

    def solve(self, items: list[Item], quads: list[Quad]) -> Answers:
        """For each item, for each hit: the solutions some SPU wants, as codes (None: none; OVER:
        past the item's limit, see :meth:`_bounded`; TIMED_OUT: a bounded group's hit not looked
        up, the job's deadline passed)."""
        terms = self.decoder.terms
        out: Answers = []
        for gid, branch_index, pattern, hits, limit, bounded in items:
            group = self.groups[gid]
            branch = group.shape.branches[branch_index]
            positions = [branch.variables.index(name) for name in branch.param_vars]
            wanted = self.wanted[gid][branch_index]
            answers: list[list[tuple[Code, ...]] | str | None] = []
            # a one-pattern branch's hit reads nothing (the quad is the solution): never timed out,
            # as in sequential mode (broker.core.lookups)
            timed = bounded and len(branch.patterns) > 1
            if limit is not None:
                self._bounded(timed, group, (branch_index, pattern), hits, quads, positions, wanted, limit, answers)
                out.append(answers)
                continue
            for index, params in hits:
                if timed and time.monotonic() > self.deadline:
                    answers.append(TIMED_OUT)
                    continue
                mus = group.hit_solutions(
                    self.store, (branch_index, pattern), quads[index], None if params is None else terms(params)
                )
                if mus and params is None:
                    mus = [mu for mu in mus if tuple(mu[position] for position in positions) in wanted]
                answers.append([encode_all(mu) for mu in mus] if mus else None)
            out.append(answers)
        return out

    def _bounded(
        self,
        timed: bool,
        group: ShapeGroup,
        ref: tuple[int, int],
        hits: list[tuple[int, tuple[Code, ...] | None]],
        quads: list[Quad],
        positions: list[int],
        wanted: Counter[tuple[object, ...]],
        limit: int,
        answers: list[list[tuple[Code, ...]] | str | None],
    ) -> None:
        """`solve` for the hits of a bounded group (broker.core.spu.ShapeGroup.collect): the
        solutions each SPU gains are counted (weighed: broker.core.held.row_weight), by its parameter
        values, and past `limit` its hits
        are answered OVER and not evaluated any more (the engine ends it); a hit that may concern
        several SPUs is answered OVER once any of them is past it (the engine ends them all). Why
        here: the engine learns of the solutions only from this reply, and a product of a graph
        with itself made one of 980,000 solutions from a 700-triple update, 892 MB once unpickled."""
        terms = self.decoder.terms
        gained: Counter[object] = Counter()
        every = False  # a hit for any SPU went past: all of them are ended
        for index, params in hits:
            if every or (params is not None and gained[params] > limit):
                answers.append(OVER)
                continue
            if timed and time.monotonic() > self.deadline:
                answers.append(TIMED_OUT)
                continue
            mus = group.hit_solutions(self.store, ref, quads[index], None if params is None else terms(params), limit)
            if not mus:
                answers.append(None)
                continue
            if params is not None:
                gained[params] += len(mus) + sum(map(row_weight, mus))
                over = gained[params] > limit
            else:
                over = len(mus) > limit
                if not over:
                    keys = [tuple(mu[position] for position in positions) for mu in mus]
                    kept = [(mu, key) for mu, key in zip(mus, keys, strict=True) if key in wanted]
                    mus = [mu for mu, _ in kept]
                    for mu, key in kept:
                        gained[key] += 1 + row_weight(mu)
                    over = any(gained[key] > limit for key in set(keys))
                every = over
            answers.append(OVER if over else [encode_all(mu) for mu in mus])

    def boost(self, message: tuple[Any, ...]) -> tuple[Any, ...]:
        """The pre phase, the update's delta, the post phase (seed 001 §III-C).

        `seconds` (the engine's time limit, None for none) bounds the lookups of bounded groups'
        hits, all of the job's together, from when it is taken: past it they are answered
        TIMED_OUT, not looked up (as broker.core.lookups does in sequential mode). Why: 300 hits of
        a network client's subscription, each of ~18,000 index entries, held the update's
        notifications, and every later one's, 16.7 s here; only the 60 s reply timeout bounded them."""
        _, micros, before, removed_items, delta, added_items, seconds = message
        self.deadline = float("inf") if seconds is None else time.monotonic() + seconds
        apply_steps(self.store, before)
        added_bytes, removed_bytes, created, dropped = delta[0]
        removed = list(parse(removed_bytes, format=RdfFormat.N_QUADS)) if removed_bytes else []
        added = list(parse(added_bytes, format=RdfFormat.N_QUADS)) if added_bytes else []
        graphs = [graph_named(graph) for graph in created], [graph_named(graph) for graph in dropped]
        clock = self.store.clock
        clock.pin(micros)  # FILTERs with NOW() see the instant the engine gave the update
        try:
            started = time.perf_counter()
            lost = self.solve(removed_items, removed)
            self.store.apply(added, removed, *graphs)  # the quads parsed once, for both phases and this
            gained = self.solve(added_items, added)
            seconds = time.perf_counter() - started
        except Exception as error:  # noqa: BLE001 - reported to the engine, which logs it
            return ("failed", f"{type(error).__name__}: {str(error)[:300]}")
        finally:
            clock.unpin()
        return ("boosted", lost, gained, seconds)


def serve(connection: Connection) -> None:
    """Follow the store and answer jobs until the engine closes its end.

    The replica compacts on a thread of its own, as a query worker's does
    (:func:`broker.workers.replica.serve`): between messages, a compaction's copy (at the lowest
    priority) held every update's notifications and reply, the pipeline's later updates queued
    behind it. Measured as installed with `mode = "parallel"`, 1,000 MQTT readings/s for 45 s
    (3 runs alternated with the build before): the slowest reading 290, 297 and 739 ms against
    821, 1,015 and 859; p99 191, 146 and 336 ms against 237, 215 and 134. The lookups of a job
    may run on the old store or on the compacted one: the swap is made between two deltas, once
    the copy holds every delta applied here, and only this thread applies them.

    A later ``seed`` starts over as a new process would: a new replica, no groups, no wanted
    values (the engine tells them again)."""
    booster: Booster | None = None
    try:
        for message in received(connection):
            kind = message[0]
            if kind == "boost":
                assert booster is not None
                connection.send(booster.boost(message))
            elif kind == "apply":
                assert booster is not None
                apply_steps(booster.store, message[1])
            elif kind == "group":
                assert booster is not None
                booster.add_group(message[1], message[2])
            elif kind == "ungroup":
                assert booster is not None
                booster.drop_group(message[1])
            elif kind == "want":
                assert booster is not None
                booster.want(*message[1:])
            elif kind == "seed":  # the first, or a wider snapshot (pipeline: a group reads more graphs)
                if booster is not None:
                    booster.compactor.close()
                    booster = None  # its replica freed before the new one loads
                replica = seeded(message, connection)
                booster = Booster(replica, seeded_quads(message, replica))
                booster.compactor.start()
                connection.send(("ready",))
    finally:
        if booster is not None:
            booster.compactor.close()


def main() -> None:
    with contextlib.suppress(OSError, AttributeError):  # die with the engine, even when it is killed
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is for the gateway to handle
    use_every_cpu()
    sock = socket.socket(fileno=int(sys.argv[1]))
    connection = Connection(sock.detach())
    threading.stack_size(WORKER_STACK_BYTES)  # FILTERs evaluate as deep as in the engine's threads
    thread = threading.Thread(target=serve, args=(connection,), name="sepa-booster")
    thread.start()
    thread.join()


if __name__ == "__main__":
    main()
