"""A client's subscription: its own spuid, alias and sequence counter over a (possibly shared) SPU."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from broker.core.notification import Notification
from broker.sparql.terms import Row


@dataclass(eq=False)
class Subscription:
    """Handle returned by Engine.subscribe.

    Several subscriptions with the same query and graphs share one SPU, but each keeps its own
    spuid, alias and sequence numbers (PROTOCOL.md: sequence increments by exactly 1 per
    notification of that subscription).
    """

    alias: str | None
    callback: Callable[[Notification], None]
    variables: tuple[str, ...] = ()
    is_ask: bool = False
    spuid: str = field(default_factory=lambda: f"sepa://subscription/{uuid.uuid4()}")
    next_sequence: int = 0
    nonblocking: bool = False  # the callback never waits: it may be called on an event loop thread
    sparql: str = ""  # the query as the client sent it (the SPU table shows it: broker.core.spu_table)
    owner: str | None = None  # who subscribed: a network client's identity or address; None in process

    def emit(
        self,
        added: Sequence[Row],
        removed: Sequence[Row],
        boolean: bool | None = None,
        previous: bool | None = None,
    ) -> Notification:
        """Build the next notification of this subscription and hand it to the callback."""
        notification = Notification(
            self.spuid, self.alias, self.next_sequence, self.variables, added, removed, boolean, previous
        )
        self.next_sequence += 1
        self.callback(notification)
        return notification
