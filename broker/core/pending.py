"""Pending delayed updates, kept where they survive a restart.

With a data directory the table lives in SQLite (`scheduled.sqlite3`, WAL, synchronous=FULL:
a committed row survives the process being killed and a power cut, like the store's journal); without one it lives
in memory and is lost with the process, like the in-memory store.

A row is deleted in the same step that puts its update's delta in the store (the store's
:class:`~broker.store.ApplyMark` callback), so a row exists exactly as long as its update has not
run: that, with the tags the store recovers from its journal, is the exactly-once guarantee.
Calls come from the engine's update thread and from the query pool; one lock serializes them.

A secure client's row keeps the `jti` and `iat` of the bearer token it was scheduled with, so a
revocation of that token finds its rows by the `pending_jti` index, not by a scan of the table
(broker.delayed, "Revoked tokens"). A table of a gateway before 2026-12-07 lacks the two columns:
they are added when it is opened (ALTER TABLE ADD COLUMN keeps every row, with none), and its rows
run as before. An older gateway cannot read a migrated table (it unpacks `SELECT *` into six
fields: ValueError); README.md says how to drop the two columns before going back to one.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from broker.errors import StoreFailed

log = logging.getLogger(__name__)

FILE = "scheduled.sqlite3"
CHECKPOINT_INTERVAL_S = 1.0
WAL_LIMIT_BYTES = 4 * 1024 * 1024  # past it, or idle, the WAL is emptied (see PendingUpdates._checkpoint)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS pending (
    id TEXT PRIMARY KEY,
    due_us INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    created_us INTEGER NOT NULL,
    sparql TEXT NOT NULL,
    options TEXT NOT NULL,
    jti TEXT,
    iat INTEGER
);
CREATE INDEX IF NOT EXISTS pending_due ON pending (due_us, seq);
CREATE TABLE IF NOT EXISTS attempts (
    id TEXT PRIMARY KEY,
    started INTEGER NOT NULL
);
"""
# what an older table lacks, added by _migrate; the index needs them, so it is made after
_TOKEN_COLUMNS = {"jti": "TEXT", "iat": "INTEGER"}
_TOKEN_INDEX = "CREATE INDEX IF NOT EXISTS pending_jti ON pending (jti) WHERE jti IS NOT NULL"
# named, not `*`: a migrated table has its columns in this order too, but a row is read by name
_COLUMNS = "id, due_us, seq, created_us, sparql, options, jti, iat"


@dataclass(frozen=True, slots=True)
class PendingUpdate:
    """One scheduled update request, with the protocol options it was sent with."""

    id: str
    due_us: int
    seq: int
    created_us: int
    sparql: str
    using_graph_uri: tuple[str, ...] = ()
    using_named_graph_uri: tuple[str, ...] = ()
    base_iri: str | None = None
    owner: str | None = None  # the secure client that scheduled it: it runs with that client's rights
    registration: str | None = None  # the owner's client_id then: a reset since drops it (None: before 2026-11)
    jti: str | None = None  # the bearer token it was scheduled with: its revocation drops it (None: plain gates,
    iat: int | None = None  # or before 2026-12-07); its `iat`, for the client's cut-off (broker.security.tokens)

    def order(self) -> tuple[int, int]:
        """Due order: by due time, then by the order they were scheduled in."""
        return (self.due_us, self.seq)


class PendingUpdates:
    """The table of pending delayed updates (see the module docstring)."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.path = Path(directory) / FILE if directory is not None else None
        self._wal = f"{self.path}-wal"
        self._db = sqlite3.connect(
            str(self.path) if self.path else ":memory:", check_same_thread=False, isolation_level=None
        )
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._checkpointer: threading.Thread | None = None
        with self._lock:
            try:
                last = self._prepare()
            except sqlite3.DatabaseError as error:
                self._db.close()
                raise StoreFailed(
                    f"{self.path} cannot be read ({error}): restore it from a copy, or move it away to start without "
                    "the delayed updates it held"
                ) from None
        self._seq = int(last)
        self._writes = 0  # commits so far: the checkpointer tells an idle table by it
        if self.path is not None:
            self._checkpointer = threading.Thread(target=self._checkpoint, name="sepa-pending-checkpoint", daemon=True)
            self._checkpointer.start()

    def _prepare(self) -> int:
        """Set the database up (the pragmas, the tables); the last sequence number. A damaged file
        raises sqlite3.DatabaseError here (at the first pragma): it was a raw traceback, 'file is
        not a database', naming no file."""
        if self.path is not None:
            self._db.execute("PRAGMA journal_mode=WAL")
            # FULL: a delayed update is acknowledged (202) only once its row is on stable storage
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._db.executescript(_SCHEMA)
        self._migrate()
        (last,) = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM pending").fetchone()
        self._attempted = {id for (id,) in self._db.execute("SELECT id FROM attempts")}
        return int(last)

    def _migrate(self) -> None:
        """Add the token columns to a table made before them, and their index. One transaction: a
        kill in between leaves the table as it was, and the next start adds them again."""
        present = {name for _, name, *_ in self._db.execute("PRAGMA table_info(pending)")}
        missing = [(name, kind) for name, kind in _TOKEN_COLUMNS.items() if name not in present]
        self._db.execute("BEGIN")
        for name, kind in missing:
            self._db.execute(f"ALTER TABLE pending ADD COLUMN {name} {kind}")
        self._db.execute(_TOKEN_INDEX)
        self._db.execute("COMMIT")
        if missing:
            log.info("pending-update table migrated", extra={"added": [name for name, _ in missing]})

    def _checkpoint(self) -> None:
        """Copy the WAL into the database file every second, on this thread.

        SQLite would otherwise checkpoint (and fsync) inside whichever commit crosses the WAL size
        limit: on the engine's update thread, stalling every update behind it for milliseconds.
        A PASSIVE checkpoint never blocks the writer. But a WAL starts again from its beginning only
        when a write finds it wholly copied, which never happens while updates keep coming: it
        grew without end (667 MB in 15 s of schedule-and-cancel on tmpfs, 121 MB in 40 s of a
        soak on the gateway). Past WAL_LIMIT_BYTES a TRUNCATE checkpoint copies the rest and
        empties it, holding the writer for that copy (4 MiB at most, a few ms).

        Idle (no commit in the last interval), a WAL of any size is emptied too: the passive
        checkpoints had copied it, but the file kept its size, up to the limit, for good. Whether it
        ended under the limit depended on how fast the last writes came: 1 run in 8 of
        test_the_pending_tables_wal_stays_bounded_under_a_steady_stream_of_writes on a loaded core
        ended at 0.1-4 MB and stayed there.
        """
        assert self.path is not None
        # timeout 0: a TRUNCATE that waited for the writer held the checkpoint lock meanwhile, and a
        # writer that never paused then failed its own (see _bound_wal): neither ever ran
        connection = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=0)
        try:
            wal = Path(f"{self.path}-wal")
            writes = self._writes
            while not self._stop.wait(CHECKPOINT_INTERVAL_S):
                idle, writes = writes == (now := self._writes), now
                try:
                    connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    size = wal.stat().st_size if wal.exists() else 0
                    if size > WAL_LIMIT_BYTES or (idle and size > 0):
                        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                except sqlite3.Error as error:
                    log.warning("pending-update checkpoint failed", extra={"error": str(error)})
        finally:
            connection.close()

    def add(
        self,
        id: str,
        due_us: int,
        created_us: int,
        sparql: str,
        *,
        using_graph_uri: tuple[str, ...] = (),
        using_named_graph_uri: tuple[str, ...] = (),
        base_iri: str | None = None,
        owner: str | None = None,
        registration: str | None = None,
        jti: str | None = None,
        iat: int | None = None,
    ) -> PendingUpdate:
        options = {"using_graph_uri": list(using_graph_uri), "using_named_graph_uri": list(using_named_graph_uri)}
        if base_iri is not None:
            options["base_iri"] = base_iri  # type: ignore[assignment]
        if owner is not None:
            options["owner"] = owner  # type: ignore[assignment]
        if registration is not None:
            options["registration"] = registration  # type: ignore[assignment]
        with self._lock:
            self._seq += 1
            self._db.execute(
                f"INSERT INTO pending ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (id, due_us, self._seq, created_us, sparql, json.dumps(options), jti, iat),
            )
            seq = self._seq
            self._bound_wal()
        return PendingUpdate(
            id,
            due_us,
            seq,
            created_us,
            sparql,
            using_graph_uri,
            using_named_graph_uri,
            base_iri,
            owner,
            registration,
            jti,
            iat,
        )

    def reschedule(self, moves: list[tuple[str, int]]) -> None:
        """Set new due times (id, due_us), in one transaction; ids no longer pending are skipped."""
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany("UPDATE pending SET due_us = ? WHERE id = ?", [(due, id) for id, due in moves])
            self._db.execute("COMMIT")
            self._bound_wal()

    def get(self, id: str) -> PendingUpdate | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_COLUMNS} FROM pending WHERE id = ?", (id,)).fetchone()
        return _pending(row) if row is not None else None

    def take_tokens(self, jtis: list[str]) -> list[PendingUpdate]:
        """Delete the pending updates scheduled with the tokens `jtis` (found by their index) and
        their attempts, in one transaction; the entries deleted. Why one: a row a commit, each
        synced (synchronous=FULL), held the update thread 38 s for a cut-off over 9,800 tokens'
        updates (2026-12-07, /tmp/atk-drv/revcost.py)."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                tokens = json.dumps(jtis)
                rows = self._db.execute(
                    f"DELETE FROM pending WHERE jti IN (SELECT value FROM json_each(?)) RETURNING {_COLUMNS}", (tokens,)
                ).fetchall()
                if self._attempted:
                    self._db.executemany("DELETE FROM attempts WHERE id = ?", [(row[0],) for row in rows])
                    self._attempted.difference_update(row[0] for row in rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._bound_wal()
        return [_pending(row) for row in rows]

    def remove(self, id: str) -> bool:
        """Delete a row (run or cancelled) and its attempts; False when there was none."""
        with self._lock:
            removed = self._db.execute("DELETE FROM pending WHERE id = ?", (id,)).rowcount > 0
            if self._attempted:
                self._db.execute("DELETE FROM attempts WHERE id = ?", (id,))
                self._attempted.discard(id)
            self._bound_wal()
            return removed

    def _bound_wal(self) -> None:
        """Empty the WAL here, on the writer's own connection, once it is past twice the limit: the
        checkpoint thread's TRUNCATE waits on the writer, and a writer that never pauses starved it
        (3,000 schedule-and-cancel writes as fast as they went: 45 MB of WAL with the thread alone).
        One stat a write (~2 us); called with the lock held, after every commit, which it counts."""
        self._writes += 1
        if self.path is None:
            return
        try:
            size = os.stat(self._wal).st_size
        except FileNotFoundError:
            return
        if size > 2 * WAL_LIMIT_BYTES:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def attempt(self, id: str) -> int:
        """Record that the update `id` starts running now; how many times it has started, this one
        included (a count above one means the process died while running it before)."""
        with self._lock:
            (started,) = self._db.execute(
                "INSERT INTO attempts (id, started) VALUES (?, 1) "
                "ON CONFLICT (id) DO UPDATE SET started = started + 1 RETURNING started",
                (id,),
            ).fetchone()
            self._attempted.add(id)
            self._bound_wal()
        return int(started)

    def all(self) -> list[PendingUpdate]:
        """Every pending update, in due order."""
        with self._lock:
            rows = self._db.execute(f"SELECT {_COLUMNS} FROM pending ORDER BY due_us, seq").fetchall()
        return [_pending(row) for row in rows]

    def timings(self) -> Iterator[tuple[str, int, int, int, str | None, str | None, str | None, int | None]]:
        """Every pending update's (id, due_us, seq, UTF-8 bytes of its text, owner, registration, jti, iat),
        in no order, read a thousand rows at a time: what the timer and the limits need at start-up,
        without the text (100,000 updates of 150 characters: `all` held 100,000 PendingUpdates and
        their texts at once). The lock is held until the last row is read."""
        query = (
            "SELECT id, due_us, seq, length(CAST(sparql AS BLOB)), json_extract(options, '$.owner'), "
            "json_extract(options, '$.registration'), jti, iat FROM pending"
        )
        with self._lock:
            cursor = self._db.execute(query)
            while rows := cursor.fetchmany(1000):
                yield from rows

    def page(
        self, after: tuple[int, int] | None, limit: int, owner: str | None = None, registration: str | None = None
    ) -> list[PendingUpdate]:
        """Up to `limit` pending updates in due order, after the position `after` (due time, seq);
        with `owner`, only that client's; with `registration` too, only those that registration
        (client_id) of it scheduled, or that were scheduled before registrations were kept.

        Why a position rather than an id to start after: the last update of a page may run or be
        cancelled before the next page is asked for; its position still says where the next begins.
        The owner is matched in SQL, so a page holds at most `limit` rows in memory (GET /scheduled
        once held every pending update, up to max_pending_bytes of SPARQL, to show a client its own)."""
        query = f"SELECT {_COLUMNS} FROM pending"
        conditions: list[str] = []
        parameters: list[object] = []
        if after is not None:
            conditions.append("(due_us, seq) > (?, ?)")
            parameters += after
        if owner is not None:
            conditions.append("json_extract(options, '$.owner') = ?")
            parameters.append(owner)
        if registration is not None:
            conditions.append("COALESCE(json_extract(options, '$.registration'), ?) = ?")
            parameters += [registration, registration]
        if conditions:
            query += " WHERE " + " AND ".join(conditions)
        query += " ORDER BY due_us, seq LIMIT ?"
        parameters.append(limit)
        with self._lock:
            rows = self._db.execute(query, parameters).fetchall()
        return [_pending(row) for row in rows]

    def __len__(self) -> int:
        with self._lock:
            (count,) = self._db.execute("SELECT COUNT(*) FROM pending").fetchone()
        return int(count)

    def close(self) -> None:
        """Stop the checkpointer, fold the WAL into the database file and close."""
        if self._checkpointer is not None:
            self._stop.set()
            self._checkpointer.join()
            self._checkpointer = None
        with self._lock:
            if self.path is not None:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.close()


def _pending(row: tuple) -> PendingUpdate:
    id, due_us, seq, created_us, sparql, options_json, jti, iat = row
    options = json.loads(options_json)
    return PendingUpdate(
        id,
        due_us,
        seq,
        created_us,
        sparql,
        tuple(options.get("using_graph_uri", ())),
        tuple(options.get("using_named_graph_uri", ())),
        options.get("base_iri"),
        options.get("owner"),
        options.get("registration"),
        jti,
        iat,
    )
