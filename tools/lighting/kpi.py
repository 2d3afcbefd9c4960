"""Key performance indicators of seed 001 (Table I) computed from one experiment's measurements.

Why a separate module: the formulas are the paper's and must not drift with the harness. The
runner only measures; everything derived (rates, ratios, shares) is computed here, from raw sums.

Definitions (n updates, m subscriptions, T_TOTAL = sum of the update calls' durations, i.e. the net
time without the harness's work between updates, which the paper calls T_OVERHEAD):

- Ups = n / T_TOTAL
- Sps = m * Ups (subscriptions processed per second, Table I / Table X)
- Tps = Nu_AVG * Sps (Nu_AVG from the update profile: dimming triples per update, Table VI)
- NL_min / NL_max: time from issuing an update to its notification reaching the callback. Unlike
  the paper's tl + tb + te it includes the store update, because the callback is all a client sees.
- E2E = (T_TOTAL - T_UPDATE) / T_UPDATE, the engine's overhead over the bare SPARQL endpoint
- LHR = 100 * (sum of the LUTT matrix) / (n * m), from the engine's lutt_hits counter, so it is
  whatever the engine counts as a hit; expected_lhr_percent is the paper's LUTT (Table IV) applied
  to the profile, for comparison with Table VIII
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

STAGES = ("t_update_s", "t_lutt_s", "t_booster_s", "t_notify_s")


@dataclass
class Measurements:
    """What the runner observed during one experiment in one engine mode."""

    experiment: str
    mode: str
    n: int
    m: int
    nu_avg: float
    update_seconds: list[float] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    lutt_hits: int = 0
    latencies: list[float] = field(default_factory=list)
    notifications: int = 0
    engine_notifications: int = 0
    notified_subscriptions: int = 0
    unexpected_notifications: int = 0
    missing_notifications: int = 0
    late_notifications: int = 0
    triples_changed: int = 0
    expected_notifications: int = 0
    expected_lhr_percent: float = 0.0
    triples_loaded: int = 0
    load_seconds: float = 0.0
    subscribe_seconds: float = 0.0


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _ms(seconds: list[float], pick: Callable[[list[float]], float]) -> float | None:
    return 1000.0 * pick(seconds) if seconds else None


def compute(meas: Measurements) -> dict[str, Any]:
    """The KPIs and timing components of one experiment, as a flat JSON-ready dict.

    Rates are None when undefined (no time measured); stage times are seconds summed over the
    experiment, their shares percentages of T_TOTAL (Table VIII's "Timing components").
    """
    t_total = sum(meas.update_seconds)
    ups = _ratio(meas.n, t_total)
    stages = {name: meas.stage_seconds.get(name, 0.0) for name in STAGES}
    t_update = stages["t_update_s"]
    e2e = _ratio(t_total - t_update, t_update)
    out: dict[str, Any] = {
        "n": meas.n,
        "m": meas.m,
        "nu_avg": meas.nu_avg,
        "t_total_s": t_total,
        "ups": ups,
        "sps": meas.m * ups if ups is not None else None,
        "tps": meas.nu_avg * meas.m * ups if ups is not None else None,
        "nl_min_ms": _ms(meas.latencies, min),
        "nl_max_ms": _ms(meas.latencies, max),
        "e2e": e2e,
        "lhr_percent": 100.0 * meas.lutt_hits / (meas.n * meas.m) if meas.n * meas.m else None,
        "notifications": meas.notifications,
        **stages,
        "t_unattributed_s": t_total - sum(stages.values()),
        "shares_percent": {name: _pct(value, t_total) for name, value in stages.items()},
        "lutt_hits": meas.lutt_hits,
        "expected_notifications": meas.expected_notifications,
        "expected_lhr_percent": meas.expected_lhr_percent,
        "counts_ok": (
            meas.notifications == meas.expected_notifications
            and meas.unexpected_notifications == 0
            and meas.missing_notifications == 0
        ),
        "engine_notifications": meas.engine_notifications,
        "notified_subscriptions": meas.notified_subscriptions,
        "unexpected_notifications": meas.unexpected_notifications,
        "missing_notifications": meas.missing_notifications,
        "late_notifications": meas.late_notifications,
        "triples_changed": meas.triples_changed,
        "triples_loaded": meas.triples_loaded,
        "load_s": meas.load_seconds,
        "subscribe_s": meas.subscribe_seconds,
        "update_max_ms": _ms(meas.update_seconds, max),
    }
    return out


def _pct(part: float, whole: float) -> float | None:
    return 100.0 * part / whole if whole else None
