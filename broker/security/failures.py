"""How many failed authentications one network address may send: a token bucket per address.

Why: nothing bounded them. From one LAN address an attack pass had 2,542 wrong client secrets a
second answered at /oauth/token, 1,357 forged ES256 bearer tokens a second checked on
/secure/query, /secure/update and WSS subscribe, and 1,645 refused registrations a second, while an
honest client's p99 went to 31-91 ms. Here each address (:func:`broker.gates.connections.peer_host`,
the key the per-address connection limits use) has `burst` failures (20), given back at `per_s` a
second (2); past them its attempts are refused with 429 and ``Retry-After`` before the work an
attempt costs (the secret's hash, the token's signature check, the registry's lock and fsync).

The rules, each a decision:

- an attempt takes a token before its work and gives it back when it succeeds: a success costs
  nothing and refunds nothing more, so a client holding valid credentials cannot wash an attack
  of its own address with successes, and concurrent attempts cannot overdraw the budget (each
  takes its token before it awaits anything);
- an address without a token has every attempt refused, the right secret too (which attempt is
  right is known only after the work being saved): an honest client sharing an address with an
  attacker (a NAT) waits until the attack stops; a bearer token the gateway already verified
  (broker.security.tokens caches them) is not an attempt and still passes, since checking it is
  a dictionary lookup;
- a token the gateway signed and only past its expiry is refused but not charged
  (broker.security.authority): nobody guesses one, its signature is checked once (the tokens'
  cache keeps it), and after a restart every secure sepa-js subscription of a host sends the
  token it subscribed with: 25 expired ones spent the burst, the clients' renewals got 429 and
  their Node process exited (docs/security.md);
- this board (loopback, a Unix socket: `peer` None) is not limited: its processes share one
  address, and they have the plain gates, unauthenticated, anyway. A reverse proxy on the board
  would make every client loopback, and so unlimited;
- the table holds :data:`MAX_ADDRESSES` addresses at most: an address's entry exists only while it
  owes tokens (a refilled one is dropped when next seen, the least recently seen first when the
  table is full), so many addresses cost bounded memory; one evicted starts again with a full
  burst, which only an attacker with thousands of addresses can cause;
- a refusal is logged once a minute at most per address, and :data:`LOG_LINES_PER_MINUTE` lines a
  minute in all, with the count since the address's last line; never a secret nor a token.

Sans-I/O and not thread-safe: the gates call it on the event loop only.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable

from broker.errors import SepaError

log = logging.getLogger(__name__)

BURST = 20  # failures an address may have in a row
PER_S = 2.0  # ...given back at this rate
MAX_ADDRESSES = 4096  # addresses the table keeps at most
LOG_EVERY_S = 60.0  # an address's refusals are logged once a minute at most
LOG_LINES_PER_MINUTE = 20  # ...and all addresses' together this many lines a minute


class TooManyFailures(SepaError):
    """429 with ``Retry-After``: the address sent too many failed authentications."""

    error = "too_many_requests"
    status_code = 429

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"too many failed authentications from this address: try again in {retry_after_s} s")
        self.retry_after_s = retry_after_s
        self.headers = {"Retry-After": str(retry_after_s)}


class _Bucket:
    __slots__ = ("logged_at", "refused", "tokens", "updated")

    def __init__(self, tokens: float, now: float) -> None:
        self.tokens = tokens
        self.updated = now
        self.logged_at = float("-inf")
        self.refused = 0  # refusals since the last line logged


class FailureBudget:
    """A token bucket of failed authentications per network address (see the module docstring)."""

    def __init__(
        self,
        burst: int = BURST,
        per_s: float = PER_S,
        *,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if burst < 1 or per_s <= 0 or max_addresses < 1:
            raise ValueError("a failure budget needs burst >= 1, per_s > 0 and max_addresses >= 1")
        self.burst = burst
        self.per_s = per_s
        self.max_addresses = max_addresses
        self.clock = clock
        self.refused = 0  # attempts refused since start
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._minute = float("-inf")
        self._lines = 0  # lines logged in the minute starting at _minute

    def __len__(self) -> int:
        return len(self._buckets)

    def _refilled(self, peer: str, now: float) -> _Bucket | None:
        bucket = self._buckets.get(peer)
        if bucket is None:
            return None
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) * self.per_s)
        bucket.updated = now
        self._buckets.move_to_end(peer)
        return bucket

    def take(self, peer: str | None) -> None:
        """One attempt from `peer` starts: its token taken, or :class:`TooManyFailures` when it has none."""
        if peer is None:
            return
        now = self.clock()
        bucket = self._refilled(peer, now)
        if bucket is None:
            while len(self._buckets) >= self.max_addresses:
                self._buckets.popitem(last=False)  # the least recently seen (likely refilled by now)
            bucket = self._buckets[peer] = _Bucket(float(self.burst), now)
        if bucket.tokens < 1.0:
            retry_after = max(1, math.ceil((1.0 - bucket.tokens) / self.per_s))
            self.refused += 1
            self._log(peer, bucket, now, retry_after)
            raise TooManyFailures(retry_after)
        bucket.tokens -= 1.0

    def give_back(self, peer: str | None) -> None:
        """The attempt `take` counted succeeded (or was not an authentication failure): its token back."""
        if peer is None:
            return
        bucket = self._refilled(peer, self.clock())
        if bucket is None:  # evicted meanwhile: it starts full anyway
            return
        bucket.tokens = min(float(self.burst), bucket.tokens + 1.0)
        if bucket.tokens >= self.burst:
            del self._buckets[peer]  # owes nothing: no entry (an honest client's successes take no room)

    def throttled(self) -> int:
        """How many addresses have no token now (for /metrics)."""
        now = self.clock()
        return sum(1 for bucket in self._buckets.values() if bucket.tokens + (now - bucket.updated) * self.per_s < 1.0)

    def _log(self, peer: str, bucket: _Bucket, now: float, retry_after: int) -> None:
        bucket.refused += 1
        if now - bucket.logged_at < LOG_EVERY_S:
            return
        if now - self._minute >= 60.0:
            self._minute, self._lines = now, 0
        if self._lines >= LOG_LINES_PER_MINUTE:
            return
        self._lines += 1
        bucket.logged_at = now
        log.warning(
            "authentication attempts refused: too many failures from one address",
            extra={"peer": peer, "refused": bucket.refused, "retry_after_s": retry_after},
        )
        bucket.refused = 0
