"""A resident store's snapshot: the store as N-Quads, written whole or not at all, and loaded
with its header checked (:mod:`broker.store`, "Resident")."""

from __future__ import annotations

import os
from pathlib import Path

from pyoxigraph import NamedNode, Store

from broker.errors import StoreFailed
from broker.store.durable import sync_directory
from broker.store.journal import graph_named, graph_text, one_line
from broker.store.live_copy import load_keeping_labels

# resident: the store's snapshot (see :mod:`broker.store`)
SNAPSHOT = "snapshot.nq"
_SNAPSHOT_MAGIC = b"SEPA-SNAPSHOT"


def write_snapshot(directory: Path, covered: int, graphs: list[NamedNode], data: bytes) -> None:
    """Write `data` (N-Quads) as the snapshot holding every generation up to `covered`: whole or not
    at all (a temporary file, synced, renamed, the directory synced). Its first line names the
    generation, how many named graph lines follow (empty graphs are not in N-Quads) and how many
    bytes follow it (see :func:`load_snapshot`). A write that fails (a full disk) takes its
    temporary file away with it: the journals hold every delta."""
    names = b"".join(graph_text(graph).encode() + b"\n" for graph in graphs)
    header = b"%s %d %d %d\n" % (_SNAPSHOT_MAGIC, covered, len(graphs), len(names) + len(data))
    temporary = directory / f"{SNAPSHOT}.tmp"
    try:
        with temporary.open("wb") as file:
            file.write(header + names)
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, directory / SNAPSHOT)
    except OSError:
        if temporary.is_file():
            temporary.unlink()
        raise
    sync_directory(directory)


def load_snapshot(snapshot: Path, target: Store) -> int:
    """Load a snapshot :func:`write_snapshot` wrote into `target`; the generation it holds.

    Its header's byte count is checked: a snapshot cut at a line boundary (a copy or a restore cut
    short) loaded without a word, 495 of 1,000 quads, and the next checkpoint made the loss
    permanent. A snapshot written before the count (three fields) is read as it is; the next
    checkpoint writes it with one. One without the header (empty: a copy or a restore that failed)
    said only that it was not a snapshot, not what to do: it says the way out too."""
    data = snapshot.read_bytes()
    newline = data.find(b"\n")
    fields = data[:newline].split()
    numbers = all(field.lstrip(b"-").isdigit() for field in fields[1:])
    if len(fields) not in (3, 4) or fields[0] != _SNAPSHOT_MAGIC or not numbers:
        raise StoreFailed(
            f"{snapshot} is not a snapshot this gateway wrote ({len(data)} bytes, no SEPA-SNAPSHOT header); "
            "restore it from a copy (the gateway does not start without the whole store)"
        )
    covered, graph_count = int(fields[1]), int(fields[2])
    if len(fields) == 4 and len(data) - newline - 1 != int(fields[3]):
        raise StoreFailed(
            f"{snapshot} is cut short or lengthened: {len(data) - newline - 1} bytes after its header, which says "
            f"{int(fields[3])}; restore it from a copy (the gateway does not start without the whole store)"
        )
    lines = data.split(b"\n", graph_count + 1)
    graphs, body = lines[1 : graph_count + 1], lines[graph_count + 1] if len(lines) > graph_count + 1 else b""
    try:
        load_keeping_labels(body, target)
        for graph in graphs:
            target.add_graph(graph_named(graph.decode()))
    except (SyntaxError, ValueError) as error:  # a disk that damaged it: said, not a traceback
        raise StoreFailed(f"{snapshot} cannot be read ({one_line(error)})") from None
    return covered
