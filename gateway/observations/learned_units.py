"""Units learned from devices' metadata (Homie `$unit` and `$description`), per value topic.

Why bounded per device, not only in all: the table was one dict of at most 65,536 topics, new ones
silently ignored past it. One sensor login filled it from its own topic (`homie/5/<login>/
$description`, ~3,000 properties a 64 KB message), and from then every other device's `$unit` was
dropped: its °F readings were stored as °C, acknowledged, with no counter and no log line. Now a
device holds at most `max_per_device` (a real Homie device has tens of properties), a device's new
`$description` replaces what its last one taught, and what does not fit is refused with an error the
adapter counts as bad input of that topic.
"""

from __future__ import annotations

from gateway.observations.errors import PayloadError

MAX_TOTAL = 65_536
MAX_PER_DEVICE = 1_024


class LearnedUnits:
    """Value topic -> unit IRI, each entry owned by the device whose metadata taught it."""

    def __init__(self, max_total: int = MAX_TOTAL, max_per_device: int = MAX_PER_DEVICE) -> None:
        self.max_total, self.max_per_device = max_total, max_per_device
        self._units: dict[str, tuple[str, str]] = {}  # topic -> (unit, device)
        self._topics: dict[str, set[str]] = {}  # device -> the topics it taught

    def __len__(self) -> int:
        return len(self._units)

    def get(self, topic: str) -> str | None:
        entry = self._units.get(topic)
        return None if entry is None else entry[0]

    def learn(self, device: str, topic: str, unit: str) -> None:
        """Remember `unit` for `topic`; PayloadError when `device` or the table is full."""
        known = self._units.get(topic)
        if known is not None and known[1] == device:
            self._units[topic] = (unit, device)
            return
        taught = self._topics.get(device, ())
        if len(taught) >= self.max_per_device:
            raise PayloadError(f"a device may teach at most {self.max_per_device} units; the rest are ignored")
        if known is None and len(self._units) >= self.max_total:
            raise PayloadError(f"the gateway keeps at most {self.max_total} learned units; the rest are ignored")
        if known is not None:
            self._release(known[1], topic)
        self._units[topic] = (unit, device)
        self._topics.setdefault(device, set()).add(topic)

    def forget(self, topic: str) -> None:
        entry = self._units.pop(topic, None)
        if entry is not None:
            self._release(entry[1], topic)

    def forget_device(self, device: str) -> None:
        """Drop every unit `device` taught (its new description replaces them)."""
        for topic in self._topics.pop(device, ()):
            del self._units[topic]

    def _release(self, device: str, topic: str) -> None:
        taught = self._topics.get(device)
        if taught is not None:
            taught.discard(topic)
            if not taught:
                del self._topics[device]
