"""What each network client's re-evaluated subscriptions cost every update, against a budget.

Why: a re-evaluated subscription (one the LUTT cannot follow: aggregates, FROM, projections...)
runs again in full on every update that may touch it, and the publisher's reply waits for all of
them (PROTOCOL.md: the reply comes after every subscription was processed). Each run is bounded by
the time limit, their sum was not: a client that may only read subscribed 40 distinct counts of a
product of two patterns over 20,000 triples (~0.25 s each), and another client's one-triple
updates took 7.7-12.9 s instead of 8 ms (100 of them: 16-32 s). A subscription's probe measures
what one run costs (its first evaluation, in a query worker); a client's re-evaluated
subscriptions may cost at most `per_client` seconds together, and one past it is refused (429
`too_costly`) before it is ever re-evaluated. Each subscription is charged, even one sharing an
SPU with another: a client's budget does not depend on what other clients subscribed.
"""

from __future__ import annotations

from collections import Counter

from broker.errors import SepaError


class TooCostly(SepaError):
    """A network client's re-evaluated subscriptions would cost every update more than its budget."""

    error = "too_costly"
    status_code = 429


class ReevalCosts:
    """Seconds charged per client (by its subscriptions' probes), against `per_client` (None: no limit)."""

    def __init__(self, per_client: float | None) -> None:
        self.per_client = per_client
        self.by_client: Counter[str] = Counter()
        self._charged: dict[str, tuple[str, float]] = {}  # spuid -> (client, seconds)
        self.refused = 0

    def charge(self, spuid: str, client: str, seconds: float) -> None:
        """Charge `client` `seconds` for subscription `spuid`; TooCostly, nothing charged, past its budget."""
        if self.per_client is not None and self.by_client[client] + seconds > self.per_client:
            self.refused += 1
            raise TooCostly(
                f"this subscription is evaluated again in full on every update (~{seconds * 1000:.0f} ms), and "
                f"with this client's others that would be more than [websocket] max_reeval_seconds_per_client "
                f"({self.per_client:g} s): subscribe to fewer, or to cheaper queries"
            )
        self.by_client[client] += seconds
        self._charged[spuid] = (client, seconds)

    def release(self, spuid: str) -> None:
        """The subscription `spuid` ended: its client's charge goes."""
        charged = self._charged.pop(spuid, None)
        if charged is None:
            return
        client, seconds = charged
        self.by_client[client] -= seconds
        if self.by_client[client] <= 1e-9:
            del self.by_client[client]
