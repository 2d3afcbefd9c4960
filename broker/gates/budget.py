"""What an address may do or hold, all its connections together: token buckets (how much of
something a client may do at once, `burst`, and then a second, `rate`) and shares per address.

Why a module: the gates bound per connection what costs the gateway without costing the client
(control frames, queued notifications), and a bound per connection alone is multiplied by the
connections one host may open (256 by default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class TokenBucket:
    """`burst` tokens, refilled at `rate` a second. Time is the caller's (a monotonic clock)."""

    burst: float
    rate: float
    tokens: float = field(init=False)
    at: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def take(self, count: float, now: float) -> bool:
        """Take `count` tokens at `now`; False when that overdrew the bucket. An overdrawn bucket
        is left empty, not in debt: the caller has refused what overdrew it, and a debt would go
        on refusing another connection of the same host long after the flood stopped."""
        if self.at is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= count
        if self.tokens >= 0:
            return True
        self.tokens = 0.0
        return False


class PerAddress(Generic[T]):
    """One `T` per address (a :class:`TokenBucket`, a queue's totals...), shared by that address's
    connections and kept while any of them is open (so the table is bounded by the connection
    limit)."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._shares: dict[str, tuple[T, int]] = {}

    def join(self, host: str) -> T:
        """The share of `host`, for one more of its connections until :meth:`leave`."""
        share, users = self._shares.get(host) or (self._factory(), 0)
        self._shares[host] = (share, users + 1)
        return share

    def leave(self, host: str) -> None:
        share, users = self._shares[host]
        if users <= 1:
            del self._shares[host]
        else:
            self._shares[host] = (share, users - 1)

    def __len__(self) -> int:
        return len(self._shares)
