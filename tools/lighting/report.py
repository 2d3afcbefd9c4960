"""Benchmark output: the JSON document and a human table set beside the paper's Table VIII.

Why the paper's figures are here: the point of reproducing the benchmark is the comparison, and the
reference broker's numbers (Intel i7-2630QM, Virtuoso, 2016) are the baseline a reader needs next
to ours. ROAD's NL_min did not survive in the seed's text of Table VIII, so it is shown as "n/a".
The paper's T_TOTAL values come from Table IX ("LUTT On" rows).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Results = dict[str, dict[str, dict[str, Any]]]

PAPER_TABLE_VIII: dict[str, dict[str, Any]] = {
    "LAMP": {
        "m": 1004,
        "n": 310,
        "nu_avg": 1,
        "lhr_percent": 0.40,
        "expected_lhr_percent": 0.40,
        "notifications": 23,
        "ups": 68,
        "sps": 68_000,
        "tps": 68_000,
        "nl_min_ms": 1.7,
        "nl_max_ms": 9.3,
        "e2e": 1.0,
        "t_total_s": 4.6,
        "shares_percent": {"t_update_s": 49, "t_lutt_s": 7, "t_booster_s": 44, "t_notify_s": "<<1"},
    },
    "ROAD": {
        "m": 1004,
        "n": 310,
        "nu_avg": 31,
        "lhr_percent": 0.72,
        "expected_lhr_percent": 0.72,
        "notifications": 1004,
        "ups": 3.8,
        "sps": 3_800,
        "tps": 117_300,
        "nl_min_ms": None,
        "nl_max_ms": 541.3,
        "e2e": 1.8,
        "t_total_s": 81.3,
        "shares_percent": {"t_update_s": 35, "t_lutt_s": 3, "t_booster_s": 62, "t_notify_s": "<<1"},
    },
}


def to_json(results: Results, peak_rss_mb: float) -> dict[str, Any]:
    """The single JSON object of ``sepa-gateway bench lighting --json``."""
    return {**results, "peak_rss_mb": round(peak_rss_mb, 1)}


def dumps(results: Results, peak_rss_mb: float) -> str:
    return json.dumps(to_json(results, peak_rss_mb), indent=2, sort_keys=False)


def _num(value: Any, digits: int = 2) -> str:
    """Plain figure: ints as they are, floats with `digits` decimals, None as n/a."""
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}"


def _rate(value: Any, digits: int = 1) -> str:
    """Rates as the paper prints them (68, 3.8K, 117.3K), plus M for ours."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        for scale, suffix in ((1e6, "M"), (1e3, "K")):
            if abs(value) >= scale:
                return f"{value / scale:.{digits}f}{suffix}"
    return _num(value, digits)


def _share(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda k: (k.get("shares_percent") or {}).get(key)


def _get(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda k: k.get(key)


Row = tuple[str, Callable[[dict[str, Any]], Any], Callable[[Any], str]]
ROWS: tuple[Row, ...] = (
    ("Subscriptions          m", _get("m"), _num),
    ("Updates                n", _get("n"), _num),
    ("Average triples/update Nu_avg", _get("nu_avg"), lambda v: _num(v, 1)),
    ("LUTT hit rate          LHR (%)", _get("lhr_percent"), lambda v: _num(v, 3)),
    ("  paper's LUTT on this profile (%)", _get("expected_lhr_percent"), lambda v: _num(v, 2)),
    ("Notifications", _get("notifications"), _num),
    ("Updates/s              Ups", _get("ups"), _rate),
    ("Subscriptions/s        Sps", _get("sps"), _rate),
    ("Triples/s              Tps", _get("tps"), _rate),
    ("Notification latency   NL_min (ms)", _get("nl_min_ms"), _num),
    ("                       NL_max (ms)", _get("nl_max_ms"), _num),
    ("Engine impact          E2E", _get("e2e"), _num),
    ("Net time               T_TOTAL (s)", _get("t_total_s"), _num),
    ("T_UPDATE  (% T_TOTAL)", _share("t_update_s"), lambda v: _num(v, 0)),
    ("T_LUTT    (% T_TOTAL)", _share("t_lutt_s"), lambda v: _num(v, 1)),
    ("T_BOOSTER (% T_TOTAL)", _share("t_booster_s"), lambda v: _num(v, 0)),
    ("T_NOTIFY  (% T_TOTAL)", _share("t_notify_s"), lambda v: _num(v, 1)),
)


def format_table(results: Results, peak_rss_mb: float, *, with_paper: bool = True) -> str:
    """Per experiment, one row per Table VIII line: the paper's figure, then one column per mode."""
    lines: list[str] = []
    for name, by_mode in results.items():
        modes = list(by_mode)
        paper = PAPER_TABLE_VIII.get(name, {}) if with_paper else {}
        header = f"{name + ' experiment':<36}{'paper':>12}" + "".join(f"{m:>14}" for m in modes)
        lines += [header, "-" * len(header)]
        for label, pick, fmt in ROWS:
            cells = [fmt(pick(paper)) if paper else "-"]
            cells += ["error" if "error" in by_mode[m] else fmt(pick(by_mode[m])) for m in modes]
            lines.append(f"{label:<36}{cells[0]:>12}" + "".join(f"{c:>14}" for c in cells[1:]))
        for mode in modes:
            k = by_mode[mode]
            if "error" in k:
                lines.append(f"  {mode}: {k['error']}")
            elif not k.get("counts_ok"):
                lines.append(
                    f"  {mode}: WRONG NOTIFICATIONS: {k['notifications']} (expected "
                    f"{k['expected_notifications']}; {k['unexpected_notifications']} unexpected, "
                    f"{k['missing_notifications']} missing)"
                )
        lines.append("")
    lines.append(f"peak RSS: {peak_rss_mb:.0f} MB")
    return "\n".join(lines)
