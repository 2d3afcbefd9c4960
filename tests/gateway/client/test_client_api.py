"""The client API, identically over the in-process and the network transport.

What it protects: PROTOCOL.md's contract as an application sees it through SepaClient. Every
test runs over both transports (the `connect` fixture), so the two cannot drift apart: the same
QueryResult (rows of pyoxigraph terms), the same update counts, the same notifications and
sequence numbers, the same errors. The central property: a subscription's ResultView, after any
series of updates, equals what a fresh query returns.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from pyoxigraph import Literal, NamedNode, Quad

from broker.api import Notification, QueryResult
from gateway.client import ClientSubscription, ResultView, SepaClientError, UpdateSummary
from tests.gateway.client.client_support import Connect, eventually, run

EX = "http://example.org/"
PREFIX = f"PREFIX ex: <{EX}>\n"


def ex(local: str) -> NamedNode:
    return NamedNode(EX + local)


async def next_notification(subscription: ClientSubscription, timeout: float = 5.0) -> Notification:
    return await subscription.next(timeout)


# -- query and update ---------------------------------------------------------------------------


def test_query_kinds_return_engine_result_objects(connect: Connect) -> None:
    async def body() -> None:
        async with connect() as client:
            summary = await client.update(PREFIX + 'INSERT DATA { ex:a ex:p "x", 2 . ex:b ex:p ex:a }')
            assert (summary.added, summary.removed) == (3, 0)
            select = await client.query(PREFIX + "SELECT ?s ?o WHERE { ?s ex:p ?o } ORDER BY ?s STR(?o)")
            assert isinstance(select, QueryResult) and select.kind == "select"
            assert select.variables == ("s", "o")
            assert list(select.rows) == [
                (ex("a"), Literal("2", datatype=NamedNode("http://www.w3.org/2001/XMLSchema#integer"))),
                (ex("a"), Literal("x")),
                (ex("b"), ex("a")),
            ]
            optional = await client.query(PREFIX + "SELECT ?s ?x WHERE { ?s ex:p ?o OPTIONAL { ?s ex:q ?x } }")
            assert all(row[1] is None for row in optional.rows)  # unbound stays None over both transports
            ask = await client.query(PREFIX + "ASK { ex:b ex:p ex:a }")
            assert (ask.kind, ask.boolean) == ("ask", True)
            construct = await client.query(PREFIX + "CONSTRUCT { ?o ex:back ?s } WHERE { ?s ex:p ?o FILTER isIRI(?o) }")
            assert construct.kind == "graph"
            assert [(t.subject, t.predicate, t.object) for t in construct.triples] == [(ex("a"), ex("back"), ex("b"))]

    run(body())


def test_dataset_parameters_of_query_and_update(connect: Connect) -> None:
    async def body() -> None:
        async with connect() as client:
            await client.update(PREFIX + "INSERT DATA { GRAPH ex:g1 { ex:a ex:p 1 } GRAPH ex:g2 { ex:b ex:p 2 } }")
            in_g1 = await client.query(PREFIX + "SELECT ?s WHERE { ?s ex:p ?o }", default_graph_uri=EX + "g1")
            assert in_g1.rows == ((ex("a"),),)
            named = await client.query(
                PREFIX + "SELECT ?g ?s WHERE { GRAPH ?g { ?s ex:p ?o } } ORDER BY ?g",
                named_graph_uri=[EX + "g1", EX + "g2"],
            )
            assert named.rows == ((ex("g1"), ex("a")), (ex("g2"), ex("b")))
            summary = await client.update(
                PREFIX + "INSERT { GRAPH ex:copy { ?s ex:copied ?o } } WHERE { ?s ex:p ?o }", using_graph_uri=EX + "g2"
            )
            assert isinstance(summary, UpdateSummary) and (summary.added, summary.removed) == (1, 0)
            copied = await client.query(PREFIX + "SELECT ?s WHERE { GRAPH ex:copy { ?s ex:copied ?o } }")
            assert copied.rows == ((ex("b"),),)

    run(body())


# -- subscriptions ------------------------------------------------------------------------------


def test_subscribe_first_result_then_changes(connect: Connect) -> None:
    async def body() -> None:
        async with connect() as client, connect() as publisher:
            await publisher.update(PREFIX + "INSERT DATA { ex:a ex:p 1 }")
            sub = await client.subscribe(PREFIX + "SELECT ?s ?o WHERE { ?s ex:p ?o }", "things")
            first = await next_notification(sub)
            assert (first.sequence, first.alias, first.variables) == (0, "things", ("s", "o"))
            assert first.spuid == sub.spuid and first.spuid.startswith("sepa://subscription/")
            assert [row[0] for row in first.added] == [ex("a")] and first.removed == ()
            summary = await publisher.update(PREFIX + "DELETE DATA { ex:a ex:p 1 } ; INSERT DATA { ex:b ex:p 2 }")
            assert summary.notifications >= 1 or summary.result is None
            second = await next_notification(sub)
            assert second.sequence == 1 and second.alias == "things"
            assert [row[0] for row in second.added] == [ex("b")]
            assert [row[0] for row in second.removed] == [ex("a")]
            await publisher.update(PREFIX + "INSERT DATA { ex:unrelated ex:q 3 }")  # no change: no notification
            await publisher.update(PREFIX + "INSERT DATA { ex:c ex:p 3 }")
            third = await next_notification(sub)
            assert third.sequence == 2 and [row[0] for row in third.added] == [ex("c")]
            assert sub.view == await client.query(PREFIX + "SELECT ?s ?o WHERE { ?s ex:p ?o }")

    run(body())


QUERIES = [
    "SELECT ?s WHERE { ?s ex:p ?o }",  # duplicates: one row per ?o
    "SELECT ?s ?o WHERE { ?s ex:p ?o FILTER(?o > 2) }",
    "SELECT ?s ?x WHERE { ?s ex:p ?o OPTIONAL { ?s ex:q ?x } }",
    "SELECT (COUNT(*) AS ?n) WHERE { ?s ex:p ?o }",
    "SELECT DISTINCT ?s WHERE { { ?s ex:p ?o } UNION { ?s ex:q ?o } }",
    "SELECT ?g ?s WHERE { GRAPH ?g { ?s ex:p ?o } }",
    "SELECT ?s WHERE { ?s ex:p ?o MINUS { ?s ex:q ?x } }",
]


def random_update(rng: random.Random) -> str:
    s, o, x = f"ex:s{rng.randrange(4)}", rng.randrange(5), rng.randrange(3)
    choice = rng.randrange(6)
    if choice == 0:
        return f"INSERT DATA {{ {s} ex:p {o} }}"
    if choice == 1:
        return f"DELETE DATA {{ {s} ex:p {o} }}"
    if choice == 2:
        return f"INSERT DATA {{ {s} ex:q {x} }}"
    if choice == 3:
        return f"DELETE WHERE {{ {s} ex:q ?any }}"
    if choice == 4:
        return f"INSERT DATA {{ GRAPH ex:g{x} {{ {s} ex:p {o} }} }}"
    return f"DELETE {{ ?s ex:p ?o }} INSERT {{ ?s ex:p {o} }} WHERE {{ ?s ex:p ?o FILTER(?o < {o}) }}"


def test_views_equal_a_fresh_query_after_a_series_of_updates(connect: Connect) -> None:
    """The contract: apply every notification in order and hold exactly the query's result."""

    async def body() -> None:
        rng = random.Random(20240611)
        async with connect() as client, connect() as publisher:
            subs = [await client.subscribe(PREFIX + query, f"q{i}") for i, query in enumerate(QUERIES)]
            for step in range(40):
                await publisher.update(PREFIX + random_update(rng))
                if step % 10 == 9:
                    for query, sub in zip(QUERIES, subs, strict=True):
                        expected = await client.query(PREFIX + query)
                        await eventually(lambda s=sub, e=expected: s.view == e, what=f"view of {query}")
            for query, sub in zip(QUERIES, subs, strict=True):
                expected = ResultView.of(await client.query(PREFIX + query))
                await eventually(lambda s=sub, e=expected: s.view == e, what=f"view of {query}")
                assert sub.view.inconsistencies == 0
                # the application saw every notification, numbered 0, 1, 2... without gaps
                seen = []
                while not sub._queue.empty():  # type: ignore[union-attr]
                    seen.append((await sub.next(1)).sequence)
                assert seen == list(range(len(seen))) and seen[-1] == sub.sequence

    run(body(), timeout=60)


def test_ask_subscription_notifies_boolean_changes(connect: Connect) -> None:
    async def body() -> None:
        async with connect() as client:
            sub = await client.subscribe(PREFIX + "ASK { ex:a ex:p ?o }")
            first = await next_notification(sub)
            assert (first.sequence, first.boolean, sub.view.boolean) == (0, False, False)
            await client.update(PREFIX + "INSERT DATA { ex:a ex:p 1 }")
            changed = await next_notification(sub)
            assert (changed.sequence, changed.boolean, changed.previous) == (1, True, False)
            await client.update(PREFIX + "INSERT DATA { ex:a ex:p 2 }")  # still true: nothing to say
            await client.update(PREFIX + "DELETE WHERE { ex:a ex:p ?o }")
            back = await next_notification(sub)
            assert (back.sequence, back.boolean, back.previous) == (2, False, True)
            assert sub.view == await client.query(PREFIX + "ASK { ex:a ex:p ?o }")

    run(body())


def test_unsubscribe_ends_only_that_subscription(connect: Connect) -> None:
    async def body() -> None:
        async with connect() as client:
            kept = await client.subscribe(PREFIX + "SELECT ?o WHERE { ex:a ex:p ?o }", "kept")
            ended = await client.subscribe(PREFIX + "SELECT ?o WHERE { ex:a ex:p ?o }", "ended")
            assert (await kept.next(5)).sequence == 0 and (await ended.next(5)).sequence == 0
            await client.unsubscribe(ended)
            assert ended.closed and client.subscriptions == [kept]
            await client.update(PREFIX + "INSERT DATA { ex:a ex:p 1 }")
            assert (await kept.next(5)).sequence == 1
            with pytest.raises(StopAsyncIteration):
                await ended.next(1)
            assert ended.sequence == 0
            await client.unsubscribe(ended)  # twice: harmless

    run(body())


def test_one_client_many_subscriptions_same_alias_and_no_alias(connect: Connect) -> None:
    """Replies are matched to concurrent subscribes correctly (one socket on the network)."""

    async def body() -> None:
        async with connect() as client, connect() as publisher:
            await publisher.update(PREFIX + "INSERT DATA { " + " ".join(f"ex:s{i} ex:p {i} ." for i in range(6)) + " }")
            queries = [PREFIX + f"SELECT ?s WHERE {{ ?s ex:p {i} }}" for i in range(6)]
            aliases = ["same", "same", "same", None, None, "other"]
            subs = await asyncio.gather(
                *(client.subscribe(q, alias) for q, alias in zip(queries, aliases, strict=True))
            )
            for i, sub in enumerate(subs):
                assert sub.alias == aliases[i]
                assert list(sub.view.rows) == [(ex(f"s{i}"),)], (i, sub.view.rows)
            assert len({sub.spuid for sub in subs}) == 6
            await publisher.update(PREFIX + "INSERT DATA { ex:t ex:p 4 }")
            assert (await subs[4].next(5)).sequence == 0
            note = await subs[4].next(5)
            assert note.sequence == 1 and note.added == ((ex("t"),),) and note.alias is None
            assert sum(sub.sequence for sub in subs) == 1

    run(body())


def test_callbacks_run_in_order_sync_and_async(connect: Connect) -> None:
    async def body() -> None:
        seen_sync: list[int] = []
        seen_async: list[int] = []

        async def slow(notification: Notification) -> None:
            await asyncio.sleep(0.01 if notification.sequence % 2 else 0)
            seen_async.append(notification.sequence)

        async with connect() as client:
            query = PREFIX + "SELECT ?o WHERE { ex:a ex:p ?o }"
            fast = await client.subscribe(query, on_notification=lambda n: seen_sync.append(n.sequence))
            await client.subscribe(query, on_notification=slow)
            for i in range(5):
                await client.update(PREFIX + f"INSERT DATA {{ ex:a ex:p {i} }}")
            await eventually(lambda: len(seen_sync) == 6 and len(seen_async) == 6, what="callbacks")
            assert seen_sync == seen_async == list(range(6))
            with pytest.raises(TypeError):
                await fast.next(1)  # a callback subscription has no queue unless asked for

    run(body())


def test_errors_carry_the_protocol_json(connect: Connect) -> None:
    async def body() -> None:
        async with connect() as client:
            with pytest.raises(SepaClientError) as syntax:
                await client.query("SELECT ?s WHERE { ?s ?p }")
            assert (syntax.value.error, syntax.value.status_code) == ("invalid_request", 400)
            assert "line 1" in syntax.value.error_description
            with pytest.raises(SepaClientError) as bad_update:
                await client.update("INSERT DATA { <http://a> <http://b> }")
            assert bad_update.value.to_json()["status_code"] == 400
            await client.update("CREATE GRAPH <http://example.org/g>")
            with pytest.raises(SepaClientError) as failed:
                await client.update("CREATE GRAPH <http://example.org/g>")
            assert failed.value.status_code == 400 and failed.value.error in ("update_failed", "invalid_request")
            good = await client.subscribe(PREFIX + "SELECT ?o WHERE { ex:a ex:p ?o }", "good")
            with pytest.raises(SepaClientError) as refused:
                await client.subscribe(PREFIX + "CONSTRUCT WHERE { ?s ?p ?o }", "construct")
            assert (refused.value.status_code, refused.value.alias) == (400, "construct")
            with pytest.raises(SepaClientError) as no_alias:
                await client.subscribe("SELECT nonsense")
            assert no_alias.value.alias is None and no_alias.value.status_code == 400
            # a refused request disturbs nothing: the good subscription still works
            await client.update(PREFIX + "INSERT DATA { ex:a ex:p 1 }")
            assert (await good.next(5)).sequence == 0
            assert (await good.next(5)).sequence == 1
            assert client.subscriptions == [good]

    run(body())


def test_close_ends_iterators_and_refuses_new_requests(connect: Connect) -> None:
    async def body() -> None:
        client = connect()
        sub = await client.subscribe(PREFIX + "SELECT ?o WHERE { ex:a ex:p ?o }")
        await sub.next(5)
        await client.close()
        assert sub.closed
        with pytest.raises(StopAsyncIteration):
            await sub.next(1)
        with pytest.raises(SepaClientError):
            await client.subscribe(PREFIX + "SELECT ?o WHERE { ex:a ex:p ?o }")
        await client.close()  # idempotent

    run(body())


def test_in_process_notifications_are_the_engines_objects(connect: Connect, transport_kind: str) -> None:
    """No copy, no JSON in-process; over the network, equal objects of the same type."""

    async def body() -> None:
        async with connect() as client:
            sub = await client.subscribe(PREFIX + "SELECT ?o WHERE { ex:a ex:p ?o }", "x")
            first = await sub.next(5)
            summary = await client.update(PREFIX + "INSERT DATA { ex:a ex:p 'v'@en }")
            second = await sub.next(5)
            assert type(first) is Notification and type(second) is Notification
            assert second.added == ((Literal("v", language="en"),),)
            assert summary.result is None  # the quads only when asked for, on every transport
            if transport_kind == "inprocess":
                assert second.extra == {}  # passed through untouched

    run(body())


def test_a_subscription_without_a_view_still_delivers_every_notification(connect: Connect) -> None:
    async def body() -> None:
        async with connect() as client:
            await client.update(PREFIX + "INSERT DATA { ex:a ex:p 1 }")
            sub = await client.subscribe(PREFIX + "SELECT ?s ?o WHERE { ?s ex:p ?o }", "mirror", keep_view=False)
            assert sub.view is None
            first = await next_notification(sub)
            assert [row[0] for row in first.added] == [ex("a")]
            await client.update(PREFIX + "DELETE DATA { ex:a ex:p 1 } ; INSERT DATA { ex:b ex:p 2 }")
            second = await next_notification(sub)
            assert second.sequence == 1 and [row[0] for row in second.added] == [ex("b")]
            assert [row[0] for row in second.removed] == [ex("a")]

    run(body())


def test_the_update_quads_on_request_alike_on_every_transport(connect: Connect) -> None:
    """`quads=True`: the quads really added and removed, as the in-process engine computes them,
    over the network too (Prefer: return=representation); literals, languages and graphs intact."""

    async def body() -> None:
        async with connect() as client:
            await client.update(PREFIX + "INSERT DATA { ex:a ex:p 1 . GRAPH ex:g { ex:a ex:q 'x\\n\"y'@fr } }")
            summary = await client.update(
                PREFIX + "DELETE { ?s ex:p ?o } INSERT { ?s ex:p 2 . ?s ex:p 1 } WHERE { ?s ex:p ?o }", quads=True
            )
            assert summary.result is not None
            assert summary.result.added == frozenset({Quad(ex("a"), ex("p"), Literal(2))})
            assert summary.result.removed == frozenset()  # deleted and re-inserted: in neither
            assert (summary.added, summary.removed) == (1, 0)
            dropped = await client.update(PREFIX + "DELETE WHERE { GRAPH ex:g { ?s ?p ?o } }", quads=True)
            assert dropped.result is not None and dropped.result.added == frozenset()
            assert dropped.result.removed == frozenset(
                {Quad(ex("a"), ex("q"), Literal('x\n"y', language="fr"), ex("g"))}
            )
            nothing = await client.update(PREFIX + "INSERT DATA { ex:a ex:p 2 }", quads=True)
            assert nothing.result is not None and not nothing.result.added and not nothing.result.removed

    run(body())
