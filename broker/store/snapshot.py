"""A resident store's snapshot: the store as N-Quads, written whole or not at all, and loaded
with its header checked (:mod:`broker.store`, "Resident")."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from pathlib import Path

from pyoxigraph import NamedNode, Store

from broker.errors import StoreFailed
from broker.store.durable import sync_directory
from broker.store.journal import graph_named, graph_text, one_line
from broker.store.live_copy import SLICE_BYTES, load_slices

# resident: the store's snapshot (see :mod:`broker.store`)
SNAPSHOT = "snapshot.nq"
_SNAPSHOT_MAGIC = b"SEPA-SNAPSHOT"
_HEADER_MAX = 256  # a first line longer than this is not a header


def write_snapshot(directory: Path, covered: int, graphs: list[NamedNode], slices: Iterable[bytes]) -> int:
    """Write the N-Quads `slices` (:func:`broker.store.live_copy.nquads_slices`) as the snapshot
    holding every generation up to `covered`, each slice as it comes; how many bytes of N-Quads.
    Whole or not at all (a temporary file, synced, renamed, the directory synced). Its first line
    names the generation, how many named graph lines follow (empty graphs are not in N-Quads) and
    how many bytes follow it (see :func:`load_snapshot`): written first as zeros of a fixed width,
    and over them once the slices are all written. A write that fails (a full disk), or a dump cut
    short, takes its temporary file away with it: the journals hold every delta. Why slices: the
    whole dump in memory was 39 MB for 231,100 quads, on top of the store, at the start after a kill
    (docs/architecture.md, "Restart after a kill")."""
    names = b"".join(graph_text(graph).encode() + b"\n" for graph in graphs)
    temporary = directory / f"{SNAPSHOT}.tmp"
    try:
        with temporary.open("wb") as file:
            file.write(_header(covered, len(graphs), 0) + names)
            written = 0
            for chunk in slices:
                file.write(chunk)
                written += len(chunk)
            file.seek(0)
            file.write(_header(covered, len(graphs), len(names) + written))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, directory / SNAPSHOT)
    except BaseException:
        if temporary.is_file():
            temporary.unlink()
        raise
    sync_directory(directory)
    return written


def _header(covered: int, graph_count: int, length: int) -> bytes:
    """A snapshot's first line; the byte count at a fixed width (:func:`write_snapshot` writes it
    twice, the same length), read as a number with leading zeros."""
    return b"%s %d %d %020d\n" % (_SNAPSHOT_MAGIC, covered, graph_count, length)


def load_snapshot(snapshot: Path, target: Store) -> int:
    """Load a snapshot :func:`write_snapshot` wrote into `target`; the generation it holds.

    Its header's byte count is checked: a snapshot cut at a line boundary (a copy or a restore cut
    short) loaded without a word, 495 of 1,000 quads, and the next checkpoint made the loss
    permanent. A snapshot written before the count (three fields) is read as it is; the next
    checkpoint writes it with one. One without the header (empty: a copy or a restore that failed)
    said only that it was not a snapshot, not what to do: it says the way out too.

    Read in slices (:func:`broker.store.live_copy.load_slices`), not whole: read whole and split,
    a 39 MB snapshot was held twice beside the store it was loaded into."""
    size = snapshot.stat().st_size
    with snapshot.open("rb") as file:
        first = file.readline(_HEADER_MAX)
        fields = first.split() if first.endswith(b"\n") else []
        numbers = all(field.lstrip(b"-").isdigit() for field in fields[1:])
        if len(fields) not in (3, 4) or fields[0] != _SNAPSHOT_MAGIC or not numbers:
            raise StoreFailed(
                f"{snapshot} is not a snapshot this gateway wrote ({size} bytes, no SEPA-SNAPSHOT header); "
                "restore it from a copy (the gateway does not start without the whole store)"
            )
        covered, graph_count = int(fields[1]), int(fields[2])
        if len(fields) == 4 and size - len(first) != int(fields[3]):
            raise StoreFailed(
                f"{snapshot} is cut short or lengthened: {size - len(first)} bytes after its header, which says "
                f"{int(fields[3])}; restore it from a copy (the gateway does not start without the whole store)"
            )
        try:
            graphs = [file.readline().rstrip(b"\n") for _ in range(graph_count)]
            load_slices(iter(functools.partial(file.read, SLICE_BYTES), b""), target)
            for graph in filter(None, graphs):
                target.add_graph(graph_named(graph.decode()))
        except (SyntaxError, ValueError) as error:  # a disk that damaged it: said, not a traceback
            raise StoreFailed(f"{snapshot} cannot be read ({one_line(error)})") from None
    return covered
