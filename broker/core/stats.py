"""Counters and stage timers of the engine (ARCHITECTURE.md principle 7: observable)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineStats:
    """Cumulative figures since start (or since :meth:`reset`).

    Stage timers follow seed 001's timing model: t_update_s (parse + delta + apply), t_lutt_s
    (matching changed quads against the LUTT), t_booster_s (SPU evaluation), t_notify_s
    (building and handing out notifications). lutt_hits counts (update, subscription) pairs that
    passed the LUTT filter, the numerator of the paper's LHR.
    """

    updates: int = 0
    notifications: int = 0
    lutt_hits: int = 0
    subscriptions_ended: int = 0  # by the engine: a re-evaluation past its time limit, or crashed
    timers: dict[str, float] = field(default_factory=dict)

    def record_update(self, timings: dict[str, float], notifications: int) -> None:
        self.updates += 1
        self.notifications += notifications
        self.lutt_hits += int(timings.get("lutt_hits", 0))
        for name, value in timings.items():
            if name.endswith("_s"):
                self.timers[name] = self.timers.get(name, 0.0) + value

    def reset(self) -> None:
        self.updates = self.notifications = self.lutt_hits = 0
        self.timers.clear()

    def snapshot(self) -> dict[str, float]:
        return {
            "updates": self.updates,
            "notifications": self.notifications,
            "lutt_hits": self.lutt_hits,
            **self.timers,
        }
