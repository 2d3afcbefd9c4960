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

    The reference broker's indicators (its JMX console) are here too: the processing time of one
    update (from its arrival in the engine to the end of processing: delta computed and applied,
    every subscription notified), as min, average and max, and the subscriptions held at most. Their
    cost, measured on the 2-core development machine (another benchmark running beside): 0.27 us more
    per :meth:`record_update` (1.76 us against 1.49 us, best of 5 x 1,000,000 calls, a clock read
    included), about 0.1 % of a LAMP update (~250 us); ``bench lighting`` incremental, before/after,
    two runs each: LAMP 2,948 and 4,040 / 4,180 and 4,353 updates/s, ROAD 263 and 239 / 147 (tests
    running beside) and 327 updates/s, within the noise of that machine.
    """

    updates: int = 0
    notifications: int = 0
    lutt_hits: int = 0
    subscriptions_ended: int = 0  # by the engine: a re-evaluation past its time limit, or crashed
    # a network client's incremental lookups too costly for the update thread, sent to the query
    # workers; and those given up on past the time limit, their SPUs ended (broker.core.lookups)
    lookups_offloaded: int = 0
    lookups_timed_out: int = 0
    subscriptions_max: int = 0  # the most subscriptions held at once (the reference broker's "max subscribers")
    processing_min_s: float = 0.0  # one update's processing time, end of processing included: the least,
    processing_max_s: float = 0.0  # the most
    processing_total_s: float = 0.0  # and in all (the average is this over `updates`)
    timers: dict[str, float] = field(default_factory=dict)

    def record_update(self, timings: dict[str, float], notifications: int, processing_s: float) -> None:
        """Count one processed update that took `processing_s` (wall clock, on the engine's thread)."""
        self.updates += 1
        self.notifications += notifications
        self.processing_total_s += processing_s
        if processing_s > self.processing_max_s:
            self.processing_max_s = processing_s
        if processing_s < self.processing_min_s or self.updates == 1:
            self.processing_min_s = processing_s
        self.lutt_hits += int(timings.get("lutt_hits", 0))
        for name, value in timings.items():
            if name.endswith("_s"):
                self.timers[name] = self.timers.get(name, 0.0) + value

    def record_subscriptions(self, count: int) -> None:
        """Note that `count` subscriptions are held now (keeps the peak)."""
        if count > self.subscriptions_max:
            self.subscriptions_max = count

    @property
    def processing_avg_s(self) -> float:
        return self.processing_total_s / self.updates if self.updates else 0.0

    def reset(self) -> None:
        self.updates = self.notifications = self.lutt_hits = 0
        self.processing_min_s = self.processing_max_s = self.processing_total_s = 0.0
        self.timers.clear()

    def snapshot(self) -> dict[str, float]:
        return {
            "updates": self.updates,
            "notifications": self.notifications,
            "lutt_hits": self.lutt_hits,
            **self.timers,
        }
