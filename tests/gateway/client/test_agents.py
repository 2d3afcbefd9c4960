"""Producer, Consumer and Aggregator over a JSAP: the chat of seed 000 §5.4, on both transports.

What it protects: the SEPA application pattern works end to end through the client API. Each
chat client runs a Sender (producer of SEND), a Receiver (aggregator: SENT notifications drive
SET_RECEIVED) and a Remover (aggregator: RECEIVED notifications drive REMOVE); after a burst of
messages every message was received and then removed, so the chat graph ends empty. A Consumer's
callbacks get the first result, then removed and added bindings. `client_for` builds a working
network client from the JSAP's own URLs.
"""

from __future__ import annotations

from typing import Any

from pyoxigraph import Literal, NamedNode

from broker.api import Notification
from gateway.client import Aggregator, Consumer, NetworkTransport, Producer, client_for
from gateway.client.client import rows_as_bindings
from gateway.jsap import Jsap
from tests.gateway.client.client_support import Connect, eventually, run
from tools.launcher import RunningGateway

CHAT = "http://wot.arces.unibo.it/chat"
PERSON1, PERSON2 = f"{CHAT}#PersonURI1", f"{CHAT}#PersonURI2"


def chat_jsap(http_port: int = 8000, ws_port: int = 9000) -> Jsap:
    """The chat JSAP (Appendix C of seed 000, trimmed), pointing at a given broker."""
    graph = f"GRAPH <{CHAT}>"
    return Jsap.from_dict(
        {
            "host": "127.0.0.1",
            "sparql11protocol": {
                "protocol": "http",
                "port": http_port,
                "query": {"path": "/query", "method": "POST", "format": "JSON"},
                "update": {"path": "/update", "method": "POST", "format": "JSON"},
            },
            "sparql11seprotocol": {
                "protocol": "ws",
                "reconnect": True,
                "availableProtocols": {"ws": {"port": ws_port, "path": "/subscribe"}},
            },
            "namespaces": {"schema": "http://schema.org/", "rdf": "http://www.w3.org/1999/02/22-rdf-syntax-ns#"},
            "extended": {"app": "chat"},
            "updates": {
                "SEND": {
                    "sparql": f"INSERT {{ {graph} {{ ?message rdf:type schema:Message ; schema:text ?text ; "
                    "schema:sender ?sender ; schema:toRecipient ?receiver ; schema:dateSent ?time } } "
                    f'WHERE {{ BIND(IRI(CONCAT("{CHAT}/message/", STRUUID())) AS ?message) BIND(NOW() AS ?time) }}',
                    "forcedBindings": {
                        "sender": {"type": "uri"},
                        "receiver": {"type": "uri"},
                        "text": {"type": "literal"},
                    },
                },
                "SET_RECEIVED": {
                    "sparql": f"INSERT {{ {graph} {{ ?message schema:dateReceived ?time }} }} "
                    f"WHERE {{ {graph} {{ ?message rdf:type schema:Message }} "
                    f"FILTER NOT EXISTS {{ {graph} {{ ?message schema:dateReceived ?received }} }} "
                    "BIND(NOW() AS ?time) }",
                    "forcedBindings": {"message": {"type": "uri"}},
                },
                "REMOVE": {
                    "sparql": f"DELETE {{ {graph} {{ ?message ?p ?o }} }} WHERE {{ {graph} {{ ?message "
                    "rdf:type schema:Message ; schema:dateReceived ?received ; ?p ?o } }",
                    "forcedBindings": {"message": {"type": "uri"}},
                },
                "REGISTER_USER": {
                    "sparql": f"INSERT DATA {{ {graph} {{ ?user rdf:type schema:Person ; schema:name ?userName }} }}",
                    "forcedBindings": {"user": {"type": "uri"}, "userName": {"type": "literal"}},
                },
                "UNREGISTER_USER": {
                    "sparql": f"DELETE WHERE {{ {graph} {{ ?user ?p ?o }} }}",
                    "forcedBindings": {"user": {"type": "uri"}},
                },
            },
            "queries": {
                "SENT": {
                    "sparql": f"SELECT ?message ?sender ?text WHERE {{ {graph} {{ ?message rdf:type schema:Message ; "
                    "schema:toRecipient ?receiver ; schema:sender ?sender ; schema:text ?text } }",
                    "forcedBindings": {"receiver": {"type": "uri"}},
                },
                "RECEIVED": {
                    "sparql": f"SELECT ?message ?receiver WHERE {{ {graph} {{ ?message rdf:type schema:Message ; "
                    "schema:sender ?sender ; schema:toRecipient ?receiver ; schema:dateReceived ?time } }",
                    "forcedBindings": {"sender": {"type": "uri"}},
                },
                "USERS": {
                    "sparql": f"SELECT ?user ?userName WHERE {{ {graph} {{ ?user rdf:type schema:Person ; "
                    "schema:name ?userName } }"
                },
                "ALL": {"sparql": f"SELECT ?s ?p ?o WHERE {{ {graph} {{ ?s ?p ?o }} }}"},
            },
        }
    )


def messages(notification: Notification) -> list[dict[str, Any]]:
    """Aggregator mapper: one update per message that appeared."""
    return [{"message": row["message"]} for row in rows_as_bindings(notification.variables, notification.added)]


def test_chat_producer_and_aggregators(connect: Connect) -> None:
    jsap = chat_jsap()

    async def body() -> None:
        async with connect() as one, connect() as two:
            agents = []
            for client, me in ((one, PERSON1), (two, PERSON2)):
                receiver = Aggregator(
                    client, jsap, "SENT", "SET_RECEIVED", mapper=messages, query_bindings={"receiver": me}
                )
                remover = Aggregator(client, jsap, "RECEIVED", "REMOVE", mapper=messages, query_bindings={"sender": me})
                await receiver.start()
                await remover.start()
                agents += [receiver, remover]
            sender = Producer(one, jsap, "SEND", bindings={"sender": PERSON1, "receiver": PERSON2})
            texts = ['hello "two"', "second\nline", "x' } ; DROP ALL ; #"]  # forced bindings are written safely
            for text in texts:
                summary = await sender.produce(text=text)
                assert summary.added == 5
            receiver_two = agents[2]
            remover_one = agents[1]
            await eventually(lambda: remover_one.produced == 3 and receiver_two.produced == 3, what="chat rounds")
            await eventually(lambda: not receiver_two.view.rows, what="messages removed")
            left = await one.query(jsap.query_text("ALL"))
            assert left.rows == ()
            assert receiver_two.subscription is not None and receiver_two.subscription.sequence >= 3
            for agent in agents:
                assert agent.failures == 0
                await agent.stop()
            assert one.subscriptions == [] and two.subscriptions == []

    run(body())


def test_consumer_callbacks_and_aggregator_failures(connect: Connect) -> None:
    jsap = chat_jsap()

    async def body() -> None:
        calls: list[tuple[str, list[str]]] = []

        def record(kind: str) -> Any:
            async def handler(bindings: list[dict[str, Any]]) -> None:
                calls.append((kind, sorted(str(b["userName"].value) for b in bindings)))

            return handler

        async with connect() as client:
            register = Producer(client, jsap, "REGISTER_USER")
            await register.produce(user=PERSON1, userName="Ann")
            async with Consumer(
                client, jsap, "USERS", on_first=record("first"), on_added=record("added"), on_removed=record("removed")
            ) as users:
                await register.produce(user=PERSON2, userName=Literal("Bob"))
                await Producer(client, jsap, "UNREGISTER_USER").produce(user=NamedNode(PERSON1))
                await eventually(lambda: len(calls) == 3, what="consumer callbacks")
                assert calls == [("first", ["Ann"]), ("added", ["Bob"]), ("removed", ["Ann"])]
                assert [b["userName"].value for b in users.view.bindings()] == ["Bob"]
            assert client.subscriptions == []

            # an aggregator whose update cannot be written (or is refused) logs, counts and carries on
            broken = Aggregator(
                client,
                jsap,
                "USERS",
                "REGISTER_USER",
                mapper=lambda n: [{"user": "not an iri", "userName": "x"}] if n.added else None,
            )
            await broken.start()
            await register.produce(user=PERSON1, userName="Cid")
            await eventually(lambda: broken.failures == 2, what="failed updates")  # first result + Cid
            assert broken.produced == 0
            await broken.stop()

    run(body())


def test_client_for_uses_the_jsap_urls(gateway: RunningGateway) -> None:
    gateway.post_update("DROP ALL")
    jsap = chat_jsap(gateway.http_port, gateway.ws_port)

    async def body() -> None:
        client = client_for(jsap, "SENT")
        transport = client.transport
        assert isinstance(transport, NetworkTransport)
        assert (transport.query_url, transport.update_url, transport.subscribe_url) == gateway.endpoints
        assert transport.reconnect.enabled  # "reconnect": true
        async with client:
            sub = await client.subscribe(jsap.query_text("USERS"), "USERS")
            await Producer(client, jsap, "REGISTER_USER").produce(user=PERSON1, userName="Ann")
            assert (await sub.next(5)).sequence == 0
            note = await sub.next(5)
            assert rows_as_bindings(note.variables, note.added) == [
                {"user": NamedNode(PERSON1), "userName": Literal("Ann")}
            ]
        assert client_for(jsap).transport.update_url == gateway.update_url  # type: ignore[attr-defined]

    run(body())
