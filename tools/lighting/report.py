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
        "m": 1004, "n": 310, "nu_avg": 1, "lhr_percent": 0.40, "notifications": 23,
        "ups": 68, "sps": 68_000, "tps": 68_000, "nl_min_ms": 1.7, "nl_max_ms": 9.3, "e2e": 1.0,
        "t_total_s": 4.6,
        "shares_percent": {"t_update_s": 49, "t_lutt_s": 7, "t_booster_s": 44, "t_notify_s": "<<1"},
    },
    "ROAD": {
        "m": 1004, "n": 310, "nu_avg": 31, "lhr_percent": 0.72, "notifications": 1004,
        "ups": 3.8, "sps": 3_800, "tps": 117_300, "nl_min_ms": None, "nl_max_ms": 541.3, "e2e": 1.8,
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
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if abs(value) >= 10_000:
        return f"{value / 1000:.1f}K"
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}"


def _share(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda k: (k.get("shares_percent") or {}).get(key)


def _get(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda k: k.get(key)


ROWS: tuple[tuple[str, Callable[[dict[str, Any]], Any], int], ...] = (
    ("Subscriptions          m", _get("m"), 0),
    ("Updates                n", _get("n"), 0),
    ("Average triples/update Nu_avg", _get("nu_avg"), 1),
    ("LUTT hit rate          LHR (%)", _get("lhr_percent"), 2),
    ("Notifications", _get("notifications"), 0),
    ("Updates/s              Ups", _get("ups"), 1),
    ("Subscriptions/s        Sps", _get("sps"), 0),
    ("Triples/s              Tps", _get("tps"), 0),
    ("Notification latency   NL_min (ms)", _get("nl_min_ms"), 2),
    ("                       NL_max (ms)", _get("nl_max_ms"), 2),
    ("Engine impact          E2E", _get("e2e"), 2),
    ("Net time               T_TOTAL (s)", _get("t_total_s"), 2),
    ("T_UPDATE  (% T_TOTAL)", _share("t_update_s"), 0),
    ("T_LUTT    (% T_TOTAL)", _share("t_lutt_s"), 1),
    ("T_BOOSTER (% T_TOTAL)", _share("t_booster_s"), 0),
    ("T_NOTIFY  (% T_TOTAL)", _share("t_notify_s"), 1),
)


def format_table(results: Results, peak_rss_mb: float, *, with_paper: bool = True) -> str:
    """Per experiment, one row per Table VIII line: the paper's figure, then one column per mode."""
    lines: list[str] = []
    for name, by_mode in results.items():
        modes = list(by_mode)
        paper = PAPER_TABLE_VIII.get(name, {}) if with_paper else {}
        header = f"{name + ' experiment':<36}{'paper':>12}" + "".join(f"{m:>14}" for m in modes)
        lines += [header, "-" * len(header)]
        for label, pick, digits in ROWS:
            cells = [_num(pick(paper), digits) if paper else "-"]
            cells += ["error" if "error" in by_mode[m] else _num(pick(by_mode[m]), digits) for m in modes]
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
