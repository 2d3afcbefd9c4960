"""Each sensor device gets its share of the MQTT intake, so one login's flood cannot starve the others.

Why: the gateway has one session at the broker, and the broker hands it every sensor's messages
first in, first out. One login publishing 62 KB SenML packs at QoS 1 (the broker acknowledges them
at once) queued ~1,000 packs ahead of everyone: the gateway stored ~1,500 readings/s, all of them
the flooder's, and another sensor's reading was not stored within 60 s; past the broker's
max_queued_bytes, the broker drops every sensor's messages. Acknowledging is in order (MQTT), so
the gateway cannot serve the others first and come back to the flood later: the only way past the
flood is through it, and it must cost little.

So each device has a budget of readings (a token bucket: `readings_per_s`, up to `burst_s`
seconds of it saved up). A message is mapped while its device has budget left, and its readings
are charged, which may leave the device in debt (one 3,500-reading pack is admitted, not refused
for being larger than the budget). While a device is in debt and another device has sent within
ACTIVE_S, its messages are dropped before they are read (counted on their topic, acknowledged): a
dropped message costs microseconds, so the gateway gets through the flood to the other devices'
readings. A device alone (no other device sent within ACTIVE_S) may run BACKLOG_S more of its
share into debt before it is dropped: a sensor flushing what it buffered during an outage loses
nothing when nobody waits behind it (up to 30,000 readings at the default share). Unbounded, that
was a hole: a flood that began on a quiet gateway was mapped in full (17.8 million readings from
10,491 packs of 1,700 in 20 s, hours of store work) while the first reading of any other device sat
behind it at the broker, never seen, so never waiting; now it is dropped past 30,000 readings,
and the other device's reading is stored within seconds.

Two rules fit the share to how sensors really send:
- Another device counts as waiting for ACTIVE_S (15 min) after it sent. With 10 s, a sensor reporting
  every 15-60 s never counted: its next reading queued at the broker behind the flood, which was then
  mapped in full (~2,000 readings/s against a share of 200), and it was stored 27-72 s late.
- After a connect that delivers a backlog (the broker kept the session, and its first message came
  at once), each device may take BACKLOG_S more seconds of its share on top of its burst, until the
  gateway has caught up (a commit found nothing more delivered while the broker's window had room),
  or for BACKLOG_S at most. What
  the broker queued while the gateway was away was sent at the senders' own pace, but arrives all at
  once: after a 200 s outage, a sensor that had sent 40 readings/s (a fifth of its share) had
  1,500-1,800 of its readings dropped at the restart; now none (8,000 of 8,000 stored). The
  allowance is counted in readings, not time: a flood under way at the connect gets it too (24,000
  readings at the default share: 10-20 s of this machine's store), then is dropped as before. An
  unbounded catch-up instead let such a flood through for all of its 120 s.

A device is what the MQTT ACL ties to a login (gateway/appliance/mqtt_acl.py): the login in the
topic's second level (`senml/<login>`, `tele/<login>/...`, `gateway/<login>/...`,
`zigbee2mqtt/<login>`), third for Homie (`homie/5/<login>/...`); all of one login's conventions
share its budget. The topics one of the deployment's own mappings takes are one device (the adapter
says which, `MqttAdapter._device`), with a rate of their own (`mapping_readings_per_s`): that
mapping is what a login's grant is written for, and the gateway cannot tell which login published.
Counted by their first two levels, each topic of a templated grant (`plant/+/temperature`) was a
device: spread over 20 rooms, a flood of 4,000 readings at 10 readings/s a device was mapped whole
while another device waited (measured). Other topics count by their first two levels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.observations.iris import MAPPING_DEVICE

ACTIVE_S = 900.0  # another device that sent within this long is one a flood would delay (sensors report every 15 min)
BACKLOG_GAP_S = 1.0  # a broker sends what it queued for the session right after CONNACK (and the subscribe)
BACKLOG_S = 120.0  # a backlog (after a connect; a device alone) may take this many seconds of its share more
BURST_S = 30.0  # a device saves up this many seconds of its rate: a buffered backlog, a large pack
# the first topic levels of the conventions whose next level is the login (gateway/appliance/mqtt_acl.py)
OWN_CONVENTIONS = frozenset({"gateway", "tele", "stat", "zigbee2mqtt", "senml"})
# A message costs at least one reading per this many payload bytes, readings or not. Why: charged by
# its readings alone, a 62 KB SenML pack that fails at its last record (a bad unit), or whose
# records carry no value, cost a whole parse and charged nothing, so a flood of them was never
# dropped. A legitimate pack carries far more readings than this (a SenML record is ~20-30 bytes).
BYTES_PER_READING = 100
MAX_DEVICES = 10_000  # buckets kept; past it the idle, full ones go (a full bucket is the default)
LOGIN_DEVICE = "login:"  # a device key naming the login the ACL ties the topic to


def device_key(topic: str) -> str:
    """The device a topic belongs to, by the ACL's conventions (see the module docstring)."""
    levels = topic.split("/", 3)
    if levels[0] == "homie" and len(levels) > 2:
        return LOGIN_DEVICE + levels[2]
    if levels[0] in OWN_CONVENTIONS and len(levels) > 1:
        return LOGIN_DEVICE + levels[1]
    return "/".join(levels[:2])


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float  # when `tokens` was last brought up to date
    seen: float  # when the device last sent
    rate: float  # readings a second (0: no bound)
    backlog: int = -1  # the last connect whose backlog allowance it was given


class DeviceShares:
    """The devices' budgets; `admit` before mapping a message, `charge` its readings after.

    `device_of` names a topic's device (`device_key` unless the adapter knows better); a device
    whose name starts with MAPPING_DEVICE gets `mapping_readings_per_s` (None: `readings_per_s`)."""

    def __init__(
        self,
        readings_per_s: float,
        burst_s: float = BURST_S,
        active_s: float = ACTIVE_S,
        *,
        device_of: Callable[[str], str] = device_key,
        mapping_readings_per_s: float | None = None,
    ) -> None:
        self.rate = readings_per_s
        self.mapping_rate = readings_per_s if mapping_readings_per_s is None else mapping_readings_per_s
        self.burst_s = burst_s
        self.active_s = active_s
        self.dropped = 0
        self._device_of = device_of
        self._admitted: tuple[str, str] = ("", "")  # the last topic admitted and its device, for `charge`
        self._catchup_until = float("-inf")
        self._connects = 0  # connects that delivered a backlog
        self._buckets: dict[str, _Bucket] = {}
        # The two devices that sent last, newest first: whether another device is waiting is then O(1).
        self._last: tuple[str, float] = ("", float("-inf"))
        self._other: tuple[str, float] = ("", float("-inf"))

    def rate_of(self, device: str) -> float:
        """The readings a second `device` may send while others wait."""
        return self.mapping_rate if device.startswith(MAPPING_DEVICE) else self.rate

    def admit(self, topic: str, now: float) -> bool:
        """Whether a message on `topic` is to be mapped (False: drop it, its device is over its share)."""
        if self.rate <= 0 and self.mapping_rate <= 0:
            return True
        key = self._device_of(topic)
        self._admitted = (topic, key)
        if key == self._last[0]:
            self._last = (key, now)
        else:
            self._other, self._last = self._last, (key, now)
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_DEVICES:
                self._forget_idle(now)
            rate = self.rate_of(key)
            bucket = self._buckets[key] = _Bucket(rate * self.burst_s, now, now, rate)
        if bucket.rate <= 0:
            return True
        cap = bucket.rate * self.burst_s
        allowance = bucket.rate * BACKLOG_S
        if now < self._catchup_until:
            cap += allowance
            if bucket.backlog != self._connects:
                bucket.backlog = self._connects
                bucket.tokens += allowance
        bucket.tokens = min(cap, bucket.tokens + (now - bucket.at) * bucket.rate)
        bucket.at = bucket.seen = now
        alone = now - self._other[1] > self.active_s
        if bucket.tokens > 0 or (alone and bucket.tokens > -allowance):
            return True
        self.dropped += 1
        return False

    def charge(self, topic: str, readings: int, payload_bytes: int) -> None:
        """Charge a message admitted just before: its readings, but at least one per BYTES_PER_READING
        of its payload, and one (see BYTES_PER_READING); a device's debt stops at a burst and a backlog's
        allowance (only a device alone gets that deep)."""
        admitted, key = self._admitted
        bucket = self._buckets.get(key) if admitted == topic else None
        if bucket is not None and bucket.rate > 0:
            cost = max(readings, payload_bytes // BYTES_PER_READING, 1)
            bucket.tokens = max(-bucket.rate * (self.burst_s + BACKLOG_S), bucket.tokens - cost)

    def connected(self, now: float, first_after_s: float, *, resumed: bool) -> None:
        """A new connection to the broker delivers from `now`, its first message `first_after_s` after the
        connect. If the broker kept the session (`resumed`) and that came at once (BACKLOG_GAP_S), the broker
        had queued it while the gateway was away: each device may take BACKLOG_S more of its share until
        `caught_up`, or for BACKLOG_S. If not, there was none: a new session has nothing queued, and a flood
        that begins later is not a backlog."""
        if resumed and first_after_s < BACKLOG_GAP_S:
            self._connects += 1
            self._catchup_until = now + BACKLOG_S

    def caught_up(self) -> None:
        """The broker had room to send more and sent nothing: what it queued while away has been taken, and
        what is left of the allowance goes at the next message."""
        self._catchup_until = float("-inf")

    def _forget_idle(self, now: float) -> None:
        """Drop the buckets that are full again and idle; if every device is busy, start afresh (no one is
        owed anything then but a flood's debt, which it would only lose)."""
        self._buckets = {
            key: bucket
            for key, bucket in self._buckets.items()
            if now - bucket.seen <= self.active_s
            or bucket.tokens + (now - bucket.at) * bucket.rate < bucket.rate * self.burst_s
        }
        if len(self._buckets) >= MAX_DEVICES:
            self._buckets.clear()
