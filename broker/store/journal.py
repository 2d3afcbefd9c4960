"""The journal's record format: a delta and its tag encoded before the store changes, decoded at
start, and the damage a crash cannot leave told from the cut record it can (:mod:`broker.store`
says why the store has a journal at all)."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from pyoxigraph import BlankNode, NamedNode, Quad, RdfFormat, parse, serialize

from broker.errors import StoreFailed

log = logging.getLogger("broker.store")  # the name its records always carried

JOURNAL = "apply.journal"
# resident: the two journals that alternate (see :mod:`broker.store`)
JOURNALS = ("apply.journal.0", "apply.journal.1")
# the tag of the record a resident journal starts with, followed by its generation
GENERATION = "\x00generation "
_MAGIC = b"SEPA-DELTA"
# tags of the records of a request's operations and of the undo that settles them (a tag starting
# with NUL is no delayed update's: see ApplyMark)
PROVISIONAL = "\x00provisional"
SETTLED = "\x00settled"


def graph_text(graph: NamedNode | BlankNode) -> str:
    """A graph name as it travels in a journal record or to a worker: ``<iri>`` or ``_:label``.

    Why not the bare IRI: a graph name may be a blank node (pyoxigraph takes
    ``INSERT { GRAPH ?x { ... } } WHERE { BIND(BNODE() AS ?x) }``), and a DROP ALL then crashed every
    replica that read its label back as an IRI (its subscriptions ended, the next query failed)."""
    return str(graph)


def graph_named(text: str) -> NamedNode | BlankNode:
    """The graph name :func:`graph_text` wrote (a bare IRI: a journal written before it)."""
    if text.startswith("_:"):
        return BlankNode(text[2:])
    if text.startswith("<") and text.endswith(">"):
        return NamedNode(text[1:-1])
    return NamedNode(text)


def journal_entry_parts(
    added: list[Quad], removed: list[Quad], created: list[NamedNode], dropped: list[NamedNode], tag: str = ""
) -> list[bytes]:
    """One journal record in the parts it is written in: its header, then the delta (N-Quads) and
    its tag. Written one after the other (`writelines`), not joined: the record of a 24 MB update
    joined was a second copy of its N-Quads beside the parts, the update path's highest point (see
    :meth:`broker.store.RdfStore.apply`)."""
    parts = [
        serialize(removed, format=RdfFormat.N_QUADS) if removed else b"",
        serialize(added, format=RdfFormat.N_QUADS) if added else b"",
        "\n".join(map(graph_text, created)).encode(),
        "\n".join(map(graph_text, dropped)).encode(),
        tag.encode(),
    ]
    header = _MAGIC + b" " + b" ".join(str(len(part)).encode() for part in parts) + b"\n"
    return [header, *parts]


def encode_journal_entry(
    added: list[Quad], removed: list[Quad], created: list[NamedNode], dropped: list[NamedNode], tag: str = ""
) -> bytes:
    """One journal record: the delta (N-Quads) and its tag, written before the store changes."""
    return b"".join(journal_entry_parts(added, removed, created, dropped, tag))


Journalled = tuple[list[Quad], list[Quad], list[NamedNode], list[NamedNode], str]


# a record's header line: the magic and the sizes of its parts (four: a journal written before tags)
_HEADER = re.compile(rb"SEPA-DELTA(?: \d+){4,5}\n")
_HEADER_MAX = 128  # bytes of a header line at most (the magic and five sizes of up to 20 digits: 115)


class JournalDamaged(Exception):
    """A journal record that is not what the store wrote, followed by more than a crash leaves."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset, self.reason = offset, reason


def _record(file: BinaryIO, position: int) -> tuple[Journalled, int] | None:
    """The record `file` holds at `position` (where it is read from) decoded, and where the next one
    starts; None if what is there is no whole record (for :func:`_torn` to judge). JournalDamaged
    for a record whose header is whole and whose parts do not decode, unless it holds zeros and
    only zeros follow it (a power cut that lengthened the file but lost its data)."""
    header = file.readline(_HEADER_MAX)
    if _HEADER.fullmatch(header) is None:
        return None
    sizes = [int(field) for field in header.split()[1:]]
    parts = [file.read(size) for size in sizes]
    if sum(map(len, parts)) < sum(sizes):
        return None  # cut while being written: never acknowledged
    try:
        return _entry(parts), position + len(header) + sum(sizes)
    except (SyntaxError, ValueError) as error:
        if any(b"\0" in part for part in parts) and _only_zeros(file):
            return None
        raise JournalDamaged(position, f"its record there does not decode: {one_line(error)}") from None


def _only_zeros(file: BinaryIO) -> bool:
    """Whether the rest of `file` holds zeros only (read a MB at a time)."""
    return all(not chunk.strip(b"\0") for chunk in iter(lambda: file.read(1 << 20), b""))


def one_line(error: Exception, limit: int = 200) -> str:
    """An error's text on one line of at most `limit` characters (pyoxigraph's parser errors name the
    line and column of what they read)."""
    return " ".join(str(error).split())[:limit]


def _entry(parts: list[bytes]) -> Journalled:
    """A record's delta and tag from its parts (SyntaxError or ValueError if they do not decode)."""
    removed = list(parse(parts[0], format=RdfFormat.N_QUADS)) if parts[0] else []
    added = list(parse(parts[1], format=RdfFormat.N_QUADS)) if parts[1] else []
    created = [graph_named(line) for line in parts[2].decode().splitlines() if line]
    dropped = [graph_named(line) for line in parts[3].decode().splitlines() if line]
    return added, removed, created, dropped, parts[4].decode() if len(parts) > 4 else ""


def _torn(tail: bytes) -> bool:
    """Whether `tail`, what follows a journal's last whole record, is what a crash while appending
    leaves: the start of one record (its header cut, or whole with its parts cut), then at most
    zeros (a power cut can leave the file longer than the data that reached it). Anything else
    (a damaged header followed by the later records, a record whose sizes run past the next
    record's header) is damage: cutting it off silently dropped 91 of 100 acknowledged deltas
    after one flipped bit in the 10th record's header, and truncated the evidence."""
    tail = tail.rstrip(b"\0")
    header = _HEADER.match(tail)
    if header is not None:
        return _HEADER.search(tail, header.end()) is None
    start = tail[: len(_MAGIC)]
    return _MAGIC.startswith(start) and re.fullmatch(rb"( [\d ]*)?", tail[len(_MAGIC) :]) is not None


def read_journal(journal: Path) -> Iterator[Journalled]:
    """A journal's records, each decoded as it is read, for the caller to apply and let go of before
    the next is read; then, past the last complete one, a record cut while being written (a kill, a
    full disk) is cut off the file, since records appended after it would be cut off with it at the
    next replay, though acknowledged. A caller that stops early (a stale journal, of which only the
    generation record is read) leaves the file as it is.

    A damaged journal (a record that does not decode, or more than a crash leaves after the last
    whole one) is StoreFailed naming the file and the offset, once the records before the damage
    were yielded, and the file is left as it is: a start that went on would drop every
    acknowledged record after the damage for good. Whoever applied those records throws away what
    they did (:class:`broker.store.RdfStore` says how).

    Why record by record: the whole journal read and decoded first made a start's memory follow the
    journal, not the store: 57 MB of journal (20,000 readings) took a start to a peak RSS of 330 MB
    (docs/architecture.md, "Restart after a kill")."""
    if not journal.exists():
        return
    with journal.open("rb") as file:
        position = 0
        try:
            while (record := _record(file, position)) is not None:
                entry, position = record
                yield entry
                del entry, record  # before the next is decoded: one record's quads at a time
        except JournalDamaged as damaged:
            raise StoreFailed(_damage(journal, damaged.offset, damaged.reason)) from None
        file.seek(position)
        tail = file.read()
    if not tail:
        return
    if not _torn(tail):
        raise StoreFailed(_damage(journal, position, "a record there is not one this gateway wrote"))
    log.warning("the journal ends in a cut record: dropped", extra={"bytes": len(tail)})
    with journal.open("r+b") as file:
        file.truncate(position)
        os.fsync(file.fileno())


def _damage(journal: Path, offset: int, reason: str) -> str:
    """What a start refused for a damaged journal says: where, and what the operator may do."""
    return (
        f"{journal} is damaged at byte {offset} of {journal.stat().st_size} ({reason}); nothing was changed. "
        f"Keep a copy of the data directory; to start with the updates before that byte only (the later "
        f"ones are lost), truncate the file there: truncate -s {offset} {journal}"
    )


def generation_of(first: Journalled | None) -> int:
    """The generation a resident journal's first record names; -1 for none (empty, or cut)."""
    if first is not None and first[4].startswith(GENERATION):
        return int(first[4][len(GENERATION) :])
    return -1
