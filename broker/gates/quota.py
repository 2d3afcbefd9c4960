"""Subscription quotas: how many subscriptions, and how much SPARQL text, one client and all clients hold.

Why: every subscription costs the update path (its LUTT entries, its SPU) and memory for its result;
1,000 subscriptions on one socket took 23 s to subscribe and 740 MB. A client is its secure
identity, or its address on the plain gates (all its sockets together). Past a limit a subscribe
gets a 429 error frame for itself; the subscriptions already held are untouched.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from broker.errors import SepaError


class TooManySubscriptions(SepaError):
    error = "too_many_subscriptions"
    status_code = 429


@dataclass(frozen=True)
class QuotaLimits:
    per_client: int = 2_000
    per_client_bytes: int = 4 << 20
    total: int = 20_000
    total_bytes: int = 64 << 20


class SubscriptionQuota:
    """Counts held subscriptions per client and in total; shared by the plain and the secure gate."""

    def __init__(self, limits: QuotaLimits | None = None) -> None:
        self.limits = limits or QuotaLimits()
        self.count: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.total = 0
        self.total_bytes = 0

    def take(self, client: str, size: int) -> None:
        """Reserve one subscription of `size` bytes for `client`, or raise TooManySubscriptions."""
        limits = self.limits
        if self.count[client] >= limits.per_client:
            raise TooManySubscriptions(f"this client holds {limits.per_client} subscriptions, the most it may")
        if self.bytes[client] + size > limits.per_client_bytes:
            raise TooManySubscriptions(
                f"this client's subscriptions would hold more than {limits.per_client_bytes} bytes of SPARQL"
            )
        if self.total >= limits.total or self.total_bytes + size > limits.total_bytes:
            raise TooManySubscriptions("the gateway holds as many subscriptions as it may; retry later")
        self.count[client] += 1
        self.bytes[client] += size
        self.total += 1
        self.total_bytes += size

    def give_back(self, client: str, size: int) -> None:
        self.count[client] -= 1
        self.bytes[client] -= size
        self.total -= 1
        self.total_bytes -= size
        if self.count[client] <= 0:
            del self.count[client], self.bytes[client]
