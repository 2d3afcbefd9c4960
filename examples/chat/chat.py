"""The chat of seed 000 §5.4 (Roffia et al. 2018, Figure 8) on the gateway's client API.

Each chat client is three agents over ``chat.jsap`` (next to this file):

* the **Sender**, a :class:`~gateway.client.Producer` of ``SEND`` (its ``sender`` bound to the user);
* the **Receiver**, an :class:`~gateway.client.Aggregator` subscribed to ``SENT`` with ``receiver``
  bound to the user: each new message is handed to the application, then acknowledged with
  ``SET_RECEIVED`` (the receiving time);
* the **Remover**, an :class:`~gateway.client.Aggregator` subscribed to ``RECEIVED`` with
  ``sender`` bound to the user: once the other side acknowledged a message, ``REMOVE`` deletes it,
  so the store only ever holds messages not yet received.

Why the aggregators track message IRIs instead of reacting to every added row: a notification is
a difference of query *rows*, and a ``SENT`` row is not a message. When the sender's name changes
(``REGISTER_USER``), every row of its pending messages is removed and re-added with the new name
in one notification; a naive "one update per added row" aggregator would show those messages
twice. Here a message is new when its IRI appears in the result and was not there before the
notification, so each message reaches the application exactly once (and messages already waiting
when the user joins, sequence 0, are delivered too).

Why the transport is passed in: the agents are plain client-API code, so the same
:class:`ChatClient` runs over the network (any broker speaking PROTOCOL.md) and in-process (an
adapter inside the gateway), which is ARCHITECTURE.md principle 1 at work.

Run it (see README.md here)::

    python -m examples.chat.chat --url http://localhost:8000        # against a running broker
    python -m examples.chat.chat --inprocess                         # an Engine in this process
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import inspect
import json
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.api import Notification
from gateway.appliance.commands.client import jsap_with_endpoints
from gateway.client import Aggregator, Producer, SepaClient, SepaClientError, UpdateSummary
from gateway.client.agents import JsapLike
from gateway.client.client import rows_as_bindings
from gateway.jsap import Jsap

CHAT_JSAP = Path(__file__).with_name("chat.jsap")
SCHEMA_MESSAGE = "http://schema.org/Message"


@dataclass(frozen=True)
class ChatMessage:
    """A message as its recipient sees it (IRIs absolute, `sent` the xsd:dateTime lexical form)."""

    iri: str
    sender: str
    sender_name: str | None
    receiver: str
    text: str
    sent: str | None


@dataclass(frozen=True)
class Receipt:
    """The recipient acknowledged one of our messages; `removed` counts the triples REMOVE deleted
    (6: the five of SEND and the receiving time; 0 if REMOVE failed or someone removed it first)."""

    iri: str
    receiver: str
    received: str | None
    removed: int


MessageHandler = Callable[[ChatMessage], Awaitable[None] | None]
ReceiptHandler = Callable[[Receipt], Awaitable[None] | None]


async def _call(handler: Callable[[Any], Any] | None, value: Any) -> None:
    if handler is not None:
        outcome = handler(value)
        if inspect.isawaitable(outcome):
            await outcome


def _time_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """Sort key of a row by its ?time (xsd:dateTime compared as instants when readable), then IRI."""
    term = row.get("time")
    text = term.value if term is not None else ""
    try:
        instant = dt.datetime.fromisoformat(text)
        if instant.tzinfo is None:
            instant = instant.replace(tzinfo=dt.UTC)
        return (0, instant.timestamp(), row["message"].value)
    except ValueError:
        return (1, text, row["message"].value)


class MessageAggregator(Aggregator):
    """An aggregator that acts once per message IRI, whatever happens to that message's rows.

    It keeps how many rows of each message are in the subscription's result; a message whose
    count goes from zero to positive in a notification is new (:meth:`on_new`, called in ?time
    order), one whose count drops to zero is gone (and forgotten: message IRIs are never reused).
    """

    def __init__(
        self,
        client: SepaClient,
        jsap: JsapLike,
        query_id: str,
        update_id: str,
        *,
        query_bindings: Mapping[str, Any],
        alias: str,
    ) -> None:
        super().__init__(client, jsap, query_id, update_id, query_bindings=query_bindings, alias=alias)
        self.present: Counter[str] = Counter()

    async def on_notification(self, notification: Notification) -> None:
        removed = rows_as_bindings(notification.variables, notification.removed)
        added = rows_as_bindings(notification.variables, notification.added)
        touched = {row["message"].value for row in (*removed, *added)}
        before = {iri for iri in touched if self.present[iri] > 0}
        for row in removed:
            iri = row["message"].value
            if self.present[iri] <= 1:
                self.present.pop(iri, None)
            else:
                self.present[iri] -= 1
        latest: dict[str, Mapping[str, Any]] = {}
        for row in added:
            iri = row["message"].value
            self.present[iri] += 1
            latest[iri] = row
        for row in sorted((row for iri, row in latest.items() if iri not in before), key=_time_key):
            await self.on_new(row)

    async def on_new(self, row: Mapping[str, Any]) -> None:
        """One message appeared in the result (its latest row)."""
        raise NotImplementedError


class Receiver(MessageAggregator):
    """SENT (receiver = the user) -> the application, then SET_RECEIVED (the acknowledgement)."""

    def __init__(
        self,
        client: SepaClient,
        jsap: JsapLike,
        user: str,
        on_message: MessageHandler | None,
        on_acknowledged: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(
            client, jsap, "SENT", "SET_RECEIVED", query_bindings={"receiver": user}, alias=f"chat-receiver {user}"
        )
        self.user = user
        self.on_message = on_message
        self.on_acknowledged = on_acknowledged
        self.received = 0
        self.acknowledged = 0

    async def on_new(self, row: Mapping[str, Any]) -> None:
        name, sent = row.get("name"), row.get("time")
        message = ChatMessage(
            row["message"].value,
            row["sender"].value,
            None if name is None else name.value,
            self.user,
            row["text"].value,
            None if sent is None else sent.value,
        )
        self.received += 1
        try:
            await _call(self.on_message, message)
        finally:  # handed over: acknowledge it even if the application's callback failed
            if await self.produce(message=row["message"]) is not None:
                self.acknowledged += 1
                if self.on_acknowledged is not None:  # whoever waits for the count hears of it
                    await self.on_acknowledged()


class Remover(MessageAggregator):
    """RECEIVED (sender = the user) -> REMOVE, then the application hears of the receipt."""

    def __init__(self, client: SepaClient, jsap: JsapLike, user: str, on_receipt: ReceiptHandler | None) -> None:
        super().__init__(
            client, jsap, "RECEIVED", "REMOVE", query_bindings={"sender": user}, alias=f"chat-remover {user}"
        )
        self.on_receipt = on_receipt
        self.removed = 0

    async def on_new(self, row: Mapping[str, Any]) -> None:
        summary = await self.produce(message=row["message"])
        if summary is not None and summary.removed:
            self.removed += 1
        received = row.get("time")
        receipt = Receipt(
            row["message"].value,
            row["receiver"].value,
            None if received is None else received.value,
            0 if summary is None else summary.removed,
        )
        await _call(self.on_receipt, receipt)


class ChatClient:
    """One chat user: Sender, Receiver and Remover on one :class:`SepaClient` (any transport).

    `user_uri` is the user's absolute IRI, `name` is registered with ``REGISTER_USER`` on
    :meth:`start`. Received messages go to `on_message` and are kept in :attr:`messages`;
    receipts of our own messages go to `on_receipt` and :attr:`receipts`. Callbacks may be
    coroutine functions; they run on the client's event loop, one at a time, in order.
    The :class:`SepaClient` stays the caller's (closing it is the caller's job).
    """

    def __init__(
        self,
        client: SepaClient,
        jsap: JsapLike,
        user_uri: str,
        name: str,
        *,
        on_message: MessageHandler | None = None,
        on_receipt: ReceiptHandler | None = None,
    ) -> None:
        self.client = client
        self.jsap = jsap
        self.user = user_uri
        self.name = name
        self.on_message = on_message
        self.on_receipt = on_receipt
        self.messages: list[ChatMessage] = []
        self.receipts: list[Receipt] = []
        self.sent = 0
        self.sender = Producer(client, jsap, "SEND", bindings={"sender": user_uri})
        self.registrar = Producer(client, jsap, "REGISTER_USER", bindings={"user": user_uri})
        self.receiver = Receiver(client, jsap, user_uri, self._message, self._signal)
        self.remover = Remover(client, jsap, user_uri, self._receipt)
        self._changed = asyncio.Condition()

    async def start(self) -> ChatClient:
        """Register the user's name, then subscribe the Receiver and the Remover (join the chat)."""
        await self.registrar.produce(userName=self.name)
        await self.receiver.start()
        await self.remover.start()
        return self

    async def stop(self) -> None:
        """Leave the chat: end both subscriptions (messages sent to us meanwhile wait in the store)."""
        await self.receiver.stop()
        await self.remover.stop()

    async def send(self, to: str, text: str) -> UpdateSummary:
        """SEND a message; returns once the broker has processed it (raises SepaClientError if refused)."""
        summary = await self.sender.produce(receiver=to, text=text)
        self.sent += 1
        return summary

    async def wait_until(self, condition: Callable[[], bool], timeout: float | None = None) -> None:
        """Wait until `condition()` holds, re-checked after each message, acknowledgement and receipt (TimeoutError)."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(condition), timeout)

    @property
    def failures(self) -> int:
        """Acknowledgements and removals the broker refused (logged by the aggregators)."""
        return self.receiver.failures + self.remover.failures

    async def _message(self, message: ChatMessage) -> None:
        self.messages.append(message)
        await self._signal()
        await _call(self.on_message, message)

    async def _receipt(self, receipt: Receipt) -> None:
        self.receipts.append(receipt)
        await self._signal()
        await _call(self.on_receipt, receipt)

    async def _signal(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def __aenter__(self) -> ChatClient:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


async def messages_left(client: SepaClient, jsap: JsapLike) -> list[str]:
    """IRIs of the messages still in the chat graph (anything typed schema:Message or under messageBase)."""
    extended = jsap.extended if isinstance(jsap.extended, Mapping) else {}
    graph = extended.get("graph", "http://wot.arces.unibo.it/chat")
    base = extended.get("messageBase", f"{graph}/message/")
    result = await client.query(
        f"SELECT DISTINCT ?m WHERE {{ GRAPH <{graph}> {{ {{ ?m a <{SCHEMA_MESSAGE}> }} UNION "
        f"{{ ?m ?p ?o FILTER(STRSTARTS(STR(?m), {json.dumps(base)})) }} }} }}"
    )
    return sorted(row[0].value for row in result.rows if row[0] is not None)


def load_jsap(path: str | Path = CHAT_JSAP, url: str | None = None, ws_url: str | None = None) -> Jsap:
    """The chat JSAP, its broker endpoints replaced by `url` / `ws_url` when given (JSON files)."""
    if url is None and ws_url is None:
        return Jsap.load(path)
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return Jsap.from_dict(jsap_with_endpoints(data, url, ws_url))


# -- the demo ------------------------------------------------------------------------------------


def _users(jsap: JsapLike) -> list[tuple[str, str]]:
    extended = jsap.extended if isinstance(jsap.extended, Mapping) else {}
    users = [(user["uri"], user["name"]) for user in extended.get("users", []) if "uri" in user and "name" in user]
    if len(users) < 2:
        chat = "http://wot.arces.unibo.it/chat#"
        users = [(f"{chat}PersonURI1", "Client #1"), (f"{chat}PersonURI2", "Client #2")]
    return users[:2]


async def converse(
    jsap: Jsap, connect: Callable[[], SepaClient], count: int, timeout: float, out: Callable[[str], None] = print
) -> int:
    """Two users each send `count` messages to the other; prints the traffic; 0 when all were received and removed."""
    (uri_a, name_a), (uri_b, name_b) = _users(jsap)
    async with connect() as client_a, connect() as client_b:

        def printer(me: str) -> tuple[MessageHandler, ReceiptHandler]:
            def message(m: ChatMessage) -> None:
                out(f"[{me}] message from {m.sender_name or m.sender}: {m.text}")

            def receipt(r: Receipt) -> None:
                out(f"[{me}] delivered at {r.received} (removed {r.removed} triples): {r.iri}")

            return message, receipt

        on_a, receipt_a = printer(name_a)
        on_b, receipt_b = printer(name_b)
        one = ChatClient(client_a, jsap, uri_a, name_a, on_message=on_a, on_receipt=receipt_a)
        two = ChatClient(client_b, jsap, uri_b, name_b, on_message=on_b, on_receipt=receipt_b)
        async with one, two:
            for index in range(1, count + 1):
                await one.send(two.user, f"Hi {name_b}, this is message {index} of {count} from {name_a}")
                await two.send(one.user, f"Hello {name_a}, here is message {index} of {count} from {name_b}")
            try:
                for me in (one, two):
                    await me.wait_until(lambda me=me: len(me.messages) >= count and len(me.receipts) >= count, timeout)
            except TimeoutError:
                out(f"not every message was received and removed within {timeout} s")
                return 1
        left = await messages_left(client_a, jsap)
        out(f"{one.sent + two.sent} messages sent, {len(left)} left in the chat graph")
        return 0 if not left and one.failures + two.failures == 0 else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m examples.chat.chat``: two users exchange a few messages; exit 0 if all went through."""
    parser = argparse.ArgumentParser(prog="python -m examples.chat.chat", description=main.__doc__)
    parser.add_argument("--jsap", default=str(CHAT_JSAP), metavar="FILE", help="the chat JSAP (default: chat.jsap)")
    parser.add_argument("--url", help="the broker, http://host:port (default: the JSAP's, http://localhost:8000)")
    parser.add_argument("--ws-url", help="the subscribe WebSocket (default: ws://HOST:9000/subscribe with --url)")
    parser.add_argument("--inprocess", action="store_true", help="run a broker engine in this process instead")
    parser.add_argument("--messages", type=int, default=3, metavar="N", help="messages each user sends (default 3)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for delivery (default 30)")
    args = parser.parse_args(argv)
    try:
        jsap = load_jsap(args.jsap, args.url, args.ws_url)
    except (OSError, ValueError) as error:  # JsapError is a ValueError
        print(f"chat: {error}", file=sys.stderr)
        return 1

    async def run() -> int:
        if not args.inprocess:
            from gateway.client import client_for

            return await converse(jsap, lambda: client_for(jsap), args.messages, args.timeout)
        from broker.api import Engine, Scheduler
        from gateway.client import InProcessTransport

        scheduler = Scheduler(Engine())
        try:
            return await converse(jsap, lambda: SepaClient(InProcessTransport(scheduler)), args.messages, args.timeout)
        finally:
            await asyncio.to_thread(scheduler.close)

    try:
        return asyncio.run(run())
    except SepaClientError as error:
        print(f"chat: {' '.join(error.error_description.split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
