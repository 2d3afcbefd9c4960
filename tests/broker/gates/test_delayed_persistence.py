"""Delayed updates survive restarts and kill -9 (on-disk data directory): each runs exactly once,
those that fell due while the gateway was down run at start-up, in due order."""

from __future__ import annotations

import signal
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
