"""Bad input counted per source, for /metrics and a quiet log (shared by the adapters)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

OTHER_TOPICS = "(other topics)"
MAX_PER_DEVICE = 100  # of the max_topics sources one device may hold (the rest of its sources share OTHER_TOPICS)


def first_two_levels(source: str) -> str:
    """The device of a source when the adapter knows no better: its first two levels
    (`s/<sensor>` of a CoAP path, `<convention>/<device>` of most MQTT topics)."""
    return "/".join(source.split("/", 2)[:2])


class SourceCounters:
    """Bad input counted per source (an MQTT topic, a CoAP resource), logged at most once per
    `log_interval_s` per source with the count since.

    Fed by the adapters (oversize payloads, refused requests) and by the mapping layer (PayloadError,
    unmapped sources). At most `max_topics` sources are tracked, the rest under one shared entry, so
    a client sending to endless source names cannot grow memory or the log; and at most
    `max_per_device` of them per device (`device_of(source)`: the MQTT adapter gives the login the
    ACL ties a topic to), so one login's junk topics cannot take every slot and leave the other
    devices' bad input uncounted by source (one login took all 1,000). `label` names the adapter and
    its kind of source in the log ("mqtt: bad input on topic").

    At most `max_reports` lines are written per `log_interval_s` in all: one line per source
    still let a client that posts to 1,000 junk paths write 1,000 warnings a minute for as long
    as it liked. The sources held back are named by count in one line when the next interval
    starts (their counts are on /metrics), and reported with their counts when they come again.
    """

    def __init__(
        self,
        log_interval_s: float = 60.0,
        max_topics: int = 1000,
        clock: Callable[[], float] = time.monotonic,
        label: str = "mqtt: bad input on topic",
        max_reports: int = 20,
        max_per_device: int = MAX_PER_DEVICE,
        device_of: Callable[[str], str] = first_two_levels,
    ) -> None:
        self.label = label
        self.max_per_device = max_per_device
        self._device_of = device_of
        self._per_device: dict[str, int] = {}  # sources tracked per device
        self.log_interval_s = log_interval_s
        self.max_topics = max_topics
        self._clock = clock
        self.counts: dict[str, int] = {}
        self.total = 0
        self._unlogged: dict[str, int] = {}
        self._logged_at: dict[str, float] = {}
        self.max_reports = max_reports
        self._window_start: float | None = None
        self._reports = 0  # lines written since _window_start
        self._held: set[str] = set()  # sources with a report due that the budget held back

    def add(self, topic: str, reason: str) -> None:
        """Count one bad message on `topic`; `reason` says what was wrong with it (logged with the count)."""
        if topic not in self.counts:
            if len(self.counts) >= self.max_topics:
                topic = OTHER_TOPICS
            else:
                device = self._device_of(topic)
                held = self._per_device.get(device, 0)
                if held >= self.max_per_device:
                    topic = OTHER_TOPICS
                else:
                    self._per_device[device] = held + 1
        self.total += 1
        self.counts[topic] = self.counts.get(topic, 0) + 1
        self._unlogged[topic] = self._unlogged.get(topic, 0) + 1
        now = self._clock()
        last = self._logged_at.get(topic)
        if last is None or now - last >= self.log_interval_s:
            if not self._may_report(topic, now):
                return
            log.warning(
                "%s %r: %s (%d since the last report, %d in total)",
                self.label,
                topic[:200],
                reason[:300],
                self._unlogged[topic],
                self.counts[topic],
            )
            self._logged_at[topic] = now
            self._unlogged[topic] = 0

    def _may_report(self, topic: str, now: float) -> bool:
        """Whether a line may be written now (see the class docstring); starts a new interval when due."""
        if self._window_start is None or now - self._window_start >= self.log_interval_s:
            if self._held:
                log.warning(
                    "%s: %d more sources had bad input that was not reported in the last %d s (counts on /metrics)",
                    self.label,
                    len(self._held),
                    self.log_interval_s,
                )
            self._window_start, self._reports = now, 0
            self._held.clear()
        if self._reports >= self.max_reports:
            self._held.add(topic)
            return False
        self._reports += 1
        self._held.discard(topic)
        return True
