"""Delayed updates survive restarts and kill -9 (on-disk data directory): each runs exactly once,
those that fell due while the gateway was down run at start-up, in due order."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.polling import wait_until
from tools.launcher import RunningGateway, launch_gateway

EX = "http://example.org/"
NOW_MICROS = "<http://w3id.org/sepa-gateway/fn#nowMicros>"


def count_up(name: str) -> str:
    """Adds one to a counter and records when: running it twice would show as a count of 2."""
    s, c, t = f"<{EX}{name}>", f"<{EX}count>", f"<{EX}ranAt>"
    return (
        f"DELETE {{ {s} {c} ?old }} INSERT {{ {s} {c} ?new . {s} {t} ?t }} "
        f"WHERE {{ OPTIONAL {{ {s} {c} ?old }} BIND(COALESCE(?old, 0) + 1 AS ?new) BIND({NOW_MICROS}() AS ?t) }}"
    )


def counts(gateway: RunningGateway) -> dict[str, int]:
    rows = gateway.select(f"SELECT ?s ?c WHERE {{ ?s <{EX}count> ?c }}")
    return {row["s"].removeprefix(EX): int(row["c"]) for row in rows}


def pending(gateway: RunningGateway) -> list[dict]:
    return gateway.request("GET", "/scheduled").json()["scheduled"]


def utc(instant: datetime) -> str:
    return instant.isoformat().replace("+00:00", "Z")


def test_pending_updates_survive_a_restart_and_overdue_ones_run_at_start_up_in_due_order(tmp_path: Path) -> None:
    gateway = launch_gateway(data_dir=tmp_path)
    # due times from one instant: each `at` taken at its own request, a request slower than their
    # 0.1 s spacing (a loaded machine) swapped two of them and the due order was not u1, u2, u3
    base = datetime.now(UTC) + timedelta(seconds=2)
    dues = {k: base + timedelta(seconds=0.1 * k) for k in (1, 2, 3)}
    try:
        # scheduled in the opposite order of their due times
        for k in (3, 2, 1):
            assert gateway.update(count_up(f"u{k}"), params={"at": utc(dues[k])}).status == 202
        late = gateway.update(count_up("late"), params={"delay": "PT6S"})
        assert late.status == 202
        late_due = datetime.fromisoformat(late.json()["scheduled"]["due"])
        assert len(pending(gateway)) == 4
    finally:
        assert gateway.stop(signal.SIGTERM) == 0
    time.sleep(max(0.0, (dues[3] - datetime.now(UTC)).total_seconds() + 0.3))  # u1..u3 fall due while it is down
    restarted = launch_gateway(data_dir=tmp_path)
    try:
        wait_until(lambda: {"u1", "u2", "u3"} <= set(counts(restarted)), 10)
        checked_at = datetime.now(UTC)
        seen, still_pending = counts(restarted), pending(restarted)
        assert {name: seen[name] for name in ("u1", "u2", "u3")} == {"u1": 1, "u2": 1, "u3": 1}
        if checked_at < late_due:  # a slow start-up may already have reached it
            assert "late" not in seen and [entry["update"] for entry in still_pending] == [count_up("late")]
        times = [int(restarted.select(f"SELECT ?t WHERE {{ <{EX}u{k}> <{EX}ranAt> ?t }}")[0]["t"]) for k in (1, 2, 3)]
        assert times == sorted(times)  # due order, not scheduling order
        wait_until(lambda: "late" in counts(restarted), 10)
        assert pending(restarted) == []
    finally:
        assert restarted.stop(signal.SIGTERM) == 0


def test_kill_9_with_1000_pending_updates_then_restart_every_one_runs_exactly_once(tmp_path: Path) -> None:
    total = 1000
    gateway = launch_gateway(data_dir=tmp_path)
    start = datetime.now(UTC) + timedelta(seconds=6)
    try:

        def schedule(k: int) -> int:
            due = (start + timedelta(milliseconds=3 * k)).isoformat()  # spread over 3 s
            return gateway.update(count_up(f"n{k}"), params={"at": due}).status

        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(schedule, range(total))) == {202}
        assert len(pending(gateway)) == total
        wait_until(lambda: len(counts(gateway)) > 50, 30)  # some have run, most have not
    finally:
        gateway.stop(signal.SIGKILL)
    restarted = launch_gateway(data_dir=tmp_path)
    try:
        wait_until(lambda: pending(restarted) == [], 60)
        seen = counts(restarted)
        assert sorted(seen) == sorted(f"n{k}" for k in range(total))
        assert set(seen.values()) == {1}, {name: count for name, count in seen.items() if count != 1}
    finally:
        assert restarted.stop(signal.SIGTERM) == 0


# scheduled.sqlite3 as gateways before 2026-12-07 made it: no jti nor iat of the token an update
# was scheduled with (broker.core.pending migrates it)
OLD_SCHEMA = """
CREATE TABLE pending (
    id TEXT PRIMARY KEY,
    due_us INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    created_us INTEGER NOT NULL,
    sparql TEXT NOT NULL,
    options TEXT NOT NULL
);
CREATE INDEX pending_due ON pending (due_us, seq);
CREATE TABLE attempts (
    id TEXT PRIMARY KEY,
    started INTEGER NOT NULL
);
"""


def test_a_table_of_a_gateway_before_the_token_columns_keeps_and_runs_every_row(tmp_path: Path) -> None:
    """An old table is migrated at start-up (two columns added): its overdue row runs at once, its
    row due later is listed and runs when due, each once; the table has the new columns after."""
    now_us = time.time_ns() // 1000
    options = json.dumps({"using_graph_uri": [], "using_named_graph_uri": []})
    rows = [("overdue", now_us - 60_000_000, 1), ("later", now_us + 8_000_000, 2)]
    with contextlib.closing(sqlite3.connect(tmp_path / "scheduled.sqlite3")) as old:
        old.executescript(OLD_SCHEMA)
        old.executemany(
            "INSERT INTO pending VALUES (?, ?, ?, ?, ?, ?)",
            [(name, due, seq, now_us - 120_000_000, count_up(name), options) for name, due, seq in rows],
        )
        old.commit()
    gateway = launch_gateway(data_dir=tmp_path)
    try:
        wait_until(lambda: "overdue" in counts(gateway), 10)
        if "later" not in counts(gateway):  # a start-up slower than 8 s may have reached it
            assert [entry["id"] for entry in pending(gateway)] == ["later"]
        wait_until(lambda: "later" in counts(gateway), 30)
        assert counts(gateway) == {"overdue": 1, "later": 1}
        assert pending(gateway) == []
    finally:
        assert gateway.stop(signal.SIGTERM) == 0
    with contextlib.closing(sqlite3.connect(tmp_path / "scheduled.sqlite3")) as migrated:
        columns = [row[1] for row in migrated.execute("PRAGMA table_info(pending)")]
    assert columns == ["id", "due_us", "seq", "created_us", "sparql", "options", "jti", "iat"]
