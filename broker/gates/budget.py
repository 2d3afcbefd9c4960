"""Token buckets: how much of something a client may do at once (`burst`) and then a second (`rate`).

Why a module: the gates bound per connection and per address what costs the event loop without
costing the client (control frames, and failed authentications), and a bound per connection alone
is multiplied by the connections one host may open (256 by default).
"""

from __future__ import annotations

from dataclasses import dataclass, field


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


class AddressBudgets:
    """One :class:`TokenBucket` per address, shared by that address's connections and kept while
    any of them is open (so the table is bounded by the connection limit)."""

    def __init__(self, burst: float, rate: float) -> None:
        self.burst = burst
        self.rate = rate
        self._buckets: dict[str, tuple[TokenBucket, int]] = {}

    def join(self, host: str) -> TokenBucket:
        """The bucket of `host`, for one more of its connections until :meth:`leave`."""
        bucket, users = self._buckets.get(host) or (TokenBucket(self.burst, self.rate), 0)
        self._buckets[host] = (bucket, users + 1)
        return bucket

    def leave(self, host: str) -> None:
        bucket, users = self._buckets[host]
        if users <= 1:
            del self._buckets[host]
        else:
            self._buckets[host] = (bucket, users - 1)

    def __len__(self) -> int:
        return len(self._buckets)
