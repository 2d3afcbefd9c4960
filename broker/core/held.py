"""The rows network clients' subscriptions hold, against a budget for the gateway and for each client.

Why: `max_subscription_rows` bounds one subscription and `max_subscriptions_per_client` how many a
client may hold, but their product (100,000 x 2,000 by default) is no bound a board can keep. An
SPU holds its result in memory; measured on the test machine (`/tmp/mem.py` pattern: five distinct
subscriptions of 100,000 rows each, RSS before and after): an incremental SPU costs 0.21-0.28 KB a
row, a re-evaluated one 0.1-0.2 KB. So one client with 35 subscriptions of 100,000 rows each filled
a 1 GB board; with this budget it gets a 429 at the subscribe that would pass it, or its
subscription ends at the update that would.

A row is counted by its size too (:func:`row_weight`): once, and once more for each ROW_CHARS
characters of its terms. Why: rows alone bounded the count, not the bytes. A client that may write
and subscribe joined one 500,000-character literal with 500 small triples: each row held its own
copy of the literal (pyoxigraph gives a new one for each read), 250 MB for 500 rows, and 1,000
updates that each copy a 1 MiB literal into one more row would hold 1 GB in 1,000 rows. Weighed,
a row of 1 MiB counts 4,097 rows: one subscription (max_subscription_rows, 100,000) holds at most
~25 MB of such rows, and all of them together (max_held_rows) ~128 MB. A row under ROW_CHARS
characters (an IoT reading's, ~100) counts once, as before. Weighing a 3-term row costs ~0.6 us
(each term's text is copied out of pyoxigraph to be measured), paid for the rows a network client's
SPU gains, not for the gateway's own.

What is counted is memory: an SPU's rows once, however many subscribe to it, and only while a
network client (a `limited` subscription) is among them; each such client is charged the SPU's rows
once too, for the per-client budget. The gateway's own subscriptions (its adapters, the shipper)
are neither counted nor bounded.

Who calls: :class:`~broker.core.spu_manager.SpuManager`, under its state lock or (parallel mode's
collector) while the engine's thread waits for it to be idle, so no lock of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from pyoxigraph import NamedNode, Quad

from broker.errors import SepaError

# a row counts once more for each ROW_CHARS characters of its terms (about the memory an ordinary
# row costs, 0.1-0.3 KB, see above)
ROW_CHARS = 256
# said with every error about rows held, so that a client whose few long rows were refused knows why
WEIGHED = f"each counting once more for each {ROW_CHARS} characters of its terms"


def row_weight(row: Iterable[object]) -> int:
    """What a row counts beyond one: its terms' characters (their lexical forms, IRIs and blank
    node ids) // ROW_CHARS."""
    chars = 0
    for term in row:
        if term is not None:
            try:
                chars += len(term.value)  # type: ignore[attr-defined]
            except AttributeError:  # a quoted triple, the default graph
                chars += len(str(term))
    return chars // ROW_CHARS


def quad_weight(quad: Quad) -> int:
    """:func:`row_weight` of a quad's terms (an update's, see broker.core.update_processor.check_size;
    a lookup's, broker.core.budget.BudgetedStore): 0.6 us for a reading's quad, where going through
    row_weight cost 0.85."""
    try:
        chars = len(quad.subject.value) + len(quad.predicate.value) + len(quad.object.value)  # type: ignore[union-attr]
    except AttributeError:  # a quoted triple
        return row_weight((quad.subject, quad.predicate, quad.object, quad.graph_name))
    graph = quad.graph_name
    if type(graph) is NamedNode:
        chars += len(graph.value)
    return chars // ROW_CHARS


def text_weight(text: bytes) -> int:
    """The rows of a SPARQL TSV result (a header line, then one line a row), each weighed by its
    line's length as :func:`row_weight` (~0.1 us a line)."""
    lines = text.split(b"\n")[1:-1]
    if len(text) < ROW_CHARS:
        return len(lines)
    return len(lines) + sum(len(line) // ROW_CHARS for line in lines)


class TooManyRowsHeld(SepaError):
    """A network client's subscription would take the rows held past the gateway's or the client's budget."""

    error = "too_many_rows"
    status_code = 429


class HeldRows:
    """The rows each counted SPU holds, the total, and each client's share."""

    def __init__(self, total: int | None, per_client: int | None) -> None:
        """`total`, `per_client`: the budgets ([websocket] max_held_rows and max_held_rows_per_client);
        None: unbounded (the library, tests)."""
        self.budget = total
        self.per_client = per_client
        self.total = 0
        self._rows: dict[object, int] = {}  # SPU -> its rows when last counted
        self._owners: dict[object, Counter[str]] = {}  # SPU -> each client's subscriptions to it
        self._by_client: Counter[str] = Counter()

    def __contains__(self, spu: object) -> bool:
        return spu in self._rows

    def client_rows(self, client: str) -> int:
        return self._by_client[client]

    def headroom(self, spu: object, joining: str | None = None) -> int | None:
        """The rows `spu` may gain now (None: unbounded); with `joining`, a client about to
        subscribe to it, that client's room is counted too if it is not charged for `spu` yet."""
        rooms = []
        if self.budget is not None and spu in self._rows:
            rooms.append(self.budget - self.total)
        if self.per_client is not None:
            owners = self._owners.get(spu, Counter())
            clients = set(owners)
            if joining is not None and joining not in owners:
                clients.add(joining)
            rooms.extend(self.per_client - self._by_client[client] for client in clients)
        return min(rooms) if rooms else None

    def admit(self, client: str, rows: int) -> None:
        """Raises TooManyRowsHeld if a new SPU of `rows` (its probe's count) subscribed by `client`
        would take the total or the client's share past its budget: checked before the SPU is
        evaluated on the update thread (0.7 s for 99,000 rows), which :meth:`join` comes after."""
        self._check(True, True, client, rows)

    def join(self, spu: object, client: str, rows: int) -> None:
        """`client` subscribes to `spu`, which holds `rows`; raises TooManyRowsHeld, nothing
        counted, if that takes the total or the client's share past its budget."""
        new_spu = spu not in self._rows
        charged = client not in self._owners.get(spu, ())
        self._check(new_spu, charged, client, rows)
        if new_spu:
            self._rows[spu] = rows
            self._owners[spu] = Counter()
            self.total += rows
        if charged:
            self._by_client[client] += self._rows[spu]
        self._owners[spu][client] += 1

    def _check(self, new_spu: bool, charged: bool, client: str, rows: int) -> None:
        if new_spu and self.budget is not None and self.total + rows > self.budget:
            raise TooManyRowsHeld(
                f"the gateway's subscriptions hold {self.total} rows and this one would add {rows}: "
                f"more than [websocket] max_held_rows ({self.budget}; {WEIGHED}); retry later"
            )
        if charged and self.per_client is not None and self._by_client[client] + rows > self.per_client:
            raise TooManyRowsHeld(
                f"this client's subscriptions hold {self._by_client[client]} rows and this one would "
                f"add {rows}: more than [websocket] max_held_rows_per_client ({self.per_client}; {WEIGHED})"
            )

    def leave(self, spu: object, client: str) -> None:
        """One of `client`'s subscriptions to `spu` ended; the SPU is no longer counted once no
        network client subscribes to it."""
        owners = self._owners.get(spu)
        if owners is None or client not in owners:
            return
        owners[client] -= 1
        if owners[client] <= 0:
            del owners[client]
            self._charge(client, -self._rows[spu])
        if not owners:
            self.total -= self._rows.pop(spu)
            del self._owners[spu]

    def forget(self, spu: object) -> None:
        """`spu` is no longer counted (it stopped being bounded, or ended)."""
        for client in list(self._owners.get(spu, ())):
            self._charge(client, -self._rows[spu])
        if spu in self._rows:
            self.total -= self._rows.pop(spu)
            del self._owners[spu]

    def resized(self, spu: object, rows: int) -> None:
        """`spu` now holds `rows`."""
        before = self._rows.get(spu)
        if before is None or before == rows:
            return
        self._rows[spu] = rows
        self.total += rows - before
        for client in self._owners[spu]:
            self._charge(client, rows - before)

    def _charge(self, client: str, rows: int) -> None:
        self._by_client[client] += rows
        if self._by_client[client] <= 0:
            del self._by_client[client]

    def over_budget_error(self) -> TooManyRowsHeld:
        """The error a subscription ended for growing past a budget is told."""
        return TooManyRowsHeld(
            "an update would have taken the rows held by subscriptions past [websocket] max_held_rows "
            f"({self.budget}) or max_held_rows_per_client ({self.per_client}); {WEIGHED}"
        )
