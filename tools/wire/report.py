"""From the client processes' raw timestamps to the wire benchmark's figures, JSON and table.

Why separate from the runner: the runner only moves processes and bytes; every figure (throughput,
the matching of notifications to updates, percentiles, the ratio to Oxigraph) is derived here
from raw nanosecond stamps, so the definitions live in one place:

- ups = updates / (last reply - first send), wall time of the whole stream seen by the publisher;
- NL = subscriber receive time - publisher send time of the update the notification answers
  (both ``time.monotonic_ns``, one clock for the machine); p50/p99 by nearest rank;
- ratio = ups / oxigraph_ups, on the same stream, knowledge base and concurrency.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tools.wire.workload import StreamUpdate

HEADLINE = ("ups", "nl_p50_ms", "nl_p99_ms", "oxigraph_ups", "ratio")


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100) of `values`; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class Matching:
    """Notifications received, set against the ones the workload predicts."""

    latencies_ms: list[float] = field(default_factory=list)
    received: int = 0
    expected: int = 0
    unexpected: int = 0  # no such (alias, sequence) in the prediction, or received twice
    wrong_value: int = 0  # the right slot, but not the lamp/value that update set
    missing: int = 0


def match(
    expected: dict[tuple[str, int], int],
    stream: Sequence[StreamUpdate],
    records: Sequence[Sequence[Any]],
    sent_ns: Sequence[int],
) -> Matching:
    """Pair each notification record with its update by (alias, sequence), check it, time it."""
    out = Matching(received=len(records), expected=len(expected))
    seen: set[tuple[str, int]] = set()
    for alias, sequence, received_ns, added in records:
        key = (alias, int(sequence))
        k = expected.get(key)
        if k is None or key in seen:
            out.unexpected += 1
            continue
        seen.add(key)
        update = stream[k]
        if not any(value == update.value and lamp in (None, update.lamp_iri) for lamp, value in added):
            out.wrong_value += 1
            continue
        out.latencies_ms.append((received_ns - sent_ns[k]) / 1e6)
    out.missing = len(expected) - len(seen)
    return out


def throughput(published: dict[str, Any]) -> float | None:
    """Updates per second over the stream's wall time."""
    seconds = (published["finished_ns"] - published["started_ns"]) / 1e9
    return published["updates"] / seconds if seconds > 0 else None


def reply_ms(published: dict[str, Any], p: float) -> float | None:
    """Percentile of the publisher's request round trips (send to reply), in ms."""
    return percentile([(d - s) / 1e6 for s, d in zip(published["sent_ns"], published["done_ns"], strict=True)], p)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def summarize(
    *,
    published: dict[str, Any],
    matching: Matching,
    oxigraph_published: dict[str, Any] | None,
    facts: dict[str, Any],
) -> dict[str, Any]:
    """The JSON document of ``sepa-gateway bench wire --json``: the headline five keys first."""
    ups = throughput(published)
    oxigraph_ups = throughput(oxigraph_published) if oxigraph_published else None
    ratio = ups / oxigraph_ups if ups and oxigraph_ups else None
    nl = matching.latencies_ms
    return {
        "ups": _round(ups, 1),
        "nl_p50_ms": _round(percentile(nl, 50), 3),
        "nl_p99_ms": _round(percentile(nl, 99), 3),
        "oxigraph_ups": _round(oxigraph_ups, 1),
        "ratio": _round(ratio, 3),
        **facts,
        "updates": published["updates"],
        "concurrency": published["concurrency"],
        "failed_updates": published["failed"],
        "nl_min_ms": _round(min(nl) if nl else None, 3),
        "nl_max_ms": _round(max(nl) if nl else None, 3),
        "reply_p50_ms": _round(reply_ms(published, 50), 3),
        "reply_p99_ms": _round(reply_ms(published, 99), 3),
        "oxigraph_reply_p50_ms": _round(reply_ms(oxigraph_published, 50), 3) if oxigraph_published else None,
        "oxigraph_reply_p99_ms": _round(reply_ms(oxigraph_published, 99), 3) if oxigraph_published else None,
        "oxigraph_failed_updates": oxigraph_published["failed"] if oxigraph_published else None,
        "notifications": matching.received,
        "expected_notifications": matching.expected,
        "matched_notifications": len(nl),
        "unexpected_notifications": matching.unexpected,
        "wrong_notifications": matching.wrong_value,
        "missing_notifications": matching.missing,
    }


def summarize_secure(published: dict[str, Any], matching: Matching, plain: dict[str, Any]) -> dict[str, Any]:
    """The secure phase's keys of the JSON document, beside the plain run's (``secure_ratio`` is secure
    ups over plain ups of the same invocation)."""
    ups = throughput(published)
    plain_ups = throughput(plain)
    nl = matching.latencies_ms
    return {
        "secure_ups": _round(ups, 1),
        "secure_nl_p50_ms": _round(percentile(nl, 50), 3),
        "secure_nl_p99_ms": _round(percentile(nl, 99), 3),
        "secure_ratio": _round(ups / plain_ups if ups and plain_ups else None, 3),
        "secure_reply_p99_ms": _round(reply_ms(published, 99), 3),
        "secure_failed_updates": published["failed"],
        "secure_notifications": matching.received,
        "secure_wrong_notifications": matching.wrong_value,
        "secure_missing_notifications": matching.missing,
        "secure_unexpected_notifications": matching.unexpected,
    }


def ok(result: dict[str, Any]) -> bool:
    """Every update accepted and every notification received, matched and right."""
    return (
        result["failed_updates"] == 0
        and not result.get("oxigraph_failed_updates")
        and result["missing_notifications"] == 0
        and result["unexpected_notifications"] == 0
        and result["wrong_notifications"] == 0
        and not result.get("secure_failed_updates")
        and not result.get("secure_missing_notifications")
        and not result.get("secure_unexpected_notifications")
        and not result.get("secure_wrong_notifications")
    )


def dumps(result: dict[str, Any]) -> str:
    return json.dumps(result, indent=2)


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_table(result: dict[str, Any]) -> str:
    """A small human table: gateway beside Oxigraph, then the notification bookkeeping."""
    r = result
    rows = [
        ("Updates/s (ups)", _fmt(r["ups"]), _fmt(r["oxigraph_ups"])),
        ("Reply p50 (ms)", _fmt(r["reply_p50_ms"], 2), _fmt(r["oxigraph_reply_p50_ms"], 2)),
        ("Reply p99 (ms)", _fmt(r["reply_p99_ms"], 2), _fmt(r["oxigraph_reply_p99_ms"], 2)),
        ("Notification latency p50 (ms)", _fmt(r["nl_p50_ms"], 2), "-"),
        ("Notification latency p99 (ms)", _fmt(r["nl_p99_ms"], 2), "-"),
        ("Notification latency max (ms)", _fmt(r["nl_max_ms"], 2), "-"),
        ("Load time (s)", _fmt(r.get("load_seconds"), 2), _fmt(r.get("oxigraph_load_seconds"), 2)),
        ("Triples", _fmt(r.get("triples")), _fmt(r.get("oxigraph_triples"))),
    ]
    head = (
        f"Wire benchmark: {r['updates']:,} U_LAMP updates, concurrency {r['concurrency']}, "
        f"{_fmt(r.get('subscriptions'))} subscriptions on {_fmt(r.get('sockets'))} WebSockets"
    )
    width = 32
    lines = [head, "", f"{'':<{width}}{'gateway':>12}{'oxigraph':>12}", "-" * (width + 24)]
    lines += [f"{label:<{width}}{gw:>12}{ox:>12}" for label, gw, ox in rows]
    lines += [
        "",
        f"ratio ups / oxigraph_ups: {_fmt(r['ratio'], 3)}",
        f"notifications: {r['matched_notifications']:,} matched of {r['expected_notifications']:,} expected "
        f"({r['notifications']:,} received; {r['unexpected_notifications']} unexpected, "
        f"{r['wrong_notifications']} wrong, {r['missing_notifications']} missing)",
        f"failed updates: gateway {r['failed_updates']}, oxigraph {_fmt(r['oxigraph_failed_updates'])}",
    ]
    if "secure_ups" in r:
        lines += [
            "",
            f"secure gates (HTTPS + WSS, bearer token): {_fmt(r['secure_ups'])} ups "
            f"({_fmt(r['secure_ratio'], 3)}x plain), NL p99 {_fmt(r['secure_nl_p99_ms'], 2)} ms, "
            f"{r['secure_failed_updates']} failed, {r['secure_wrong_notifications']} wrong, "
            f"{r['secure_missing_notifications']} missing notifications",
        ]
    return "\n".join(lines)
