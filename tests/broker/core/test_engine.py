"""Focused tests of the engine's own mechanisms: deltas, atomicity, LUTT, SPU sharing, errors."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from pyoxigraph import DefaultGraph, Literal, NamedNode, Quad

from broker.core import spu_manager
from broker.core.engine import Engine
from broker.core.lutt import NAMED, Lutt, make_key
from broker.core.notification import Notification
from broker.core.spu import IncrementalSpu, ReevalSpu
from broker.errors import InvalidRequest, NotFound, SparqlSyntaxError, UpdateFailed

EX = "http://example.org/"


def node(name: str) -> NamedNode:
    return NamedNode(EX + name)


@pytest.fixture
def engine() -> Engine:
    engine = Engine()
    engine.update(
        f"PREFIX ex: <{EX}> INSERT DATA {{ ex:lamp1 ex:dim 10 . ex:lamp2 ex:dim 20 . ex:road ex:has ex:lamp1 }}"
    )
    return engine


def test_delta_counts_only_real_changes(engine: Engine) -> None:
    result = engine.update(f"PREFIX ex: <{EX}> INSERT DATA {{ ex:lamp1 ex:dim 10 . ex:lamp3 ex:dim 5 }}")
    assert result.added == {
        Quad(node("lamp3"), node("dim"), Literal("5", datatype=NamedNode("http://www.w3.org/2001/XMLSchema#integer")))
    }
    assert not result.removed


def test_deleted_and_reinserted_quad_is_in_neither(engine: Engine) -> None:
    result = engine.update(
        f"PREFIX ex: <{EX}> DELETE {{ ?l ex:dim ?v }} INSERT {{ ?l ex:dim ?v }} WHERE {{ ?l ex:dim ?v }}"
    )
    assert not result.added and not result.removed


def test_failing_request_changes_nothing(engine: Engine) -> None:
    before = engine.store.quads()
    with pytest.raises(UpdateFailed):
        engine.update(
            f"PREFIX ex: <{EX}> INSERT DATA {{ GRAPH ex:g {{ ex:a ex:b ex:c }} }} ; CLEAR GRAPH ex:g ; "
            f"DELETE DATA {{ ex:lamp1 ex:dim 10 }} ; CREATE GRAPH ex:g"
        )
    assert engine.store.quads() == before
    assert list(engine.store.ox.named_graphs()) == []


def test_syntax_error_names_line_and_column(engine: Engine) -> None:
    before = engine.store.quads()
    with pytest.raises(SparqlSyntaxError) as error:
        engine.update("INSERT DATA {\n  <http://a> <http://b> }")
    assert "line 2, column" in str(error.value)
    assert engine.store.quads() == before


@pytest.mark.parametrize(
    ("request_kind", "text", "prefix", "where"),
    [
        ("query", "SELECT * WHERE {\n  ?s rdf:type ?o }", "rdf", "line 2, column 14"),
        ("update", "INSERT DATA { <http://a> xsd:b 1 }", "xsd", "line 1, column 31"),
        ("subscribe", "SELECT ?d WHERE { ?s <http://a> owl:x }", "owl", "line 1, column 38"),
    ],
)
def test_an_undeclared_prefix_is_named(engine: Engine, request_kind: str, text: str, prefix: str, where: str) -> None:
    """pyoxigraph's own text lists a thousand characters of character classes after "Prefix not
    found", and names neither the prefix nor the fix."""
    run = {"query": engine.query, "update": engine.update, "subscribe": lambda sparql: engine.subscribe(sparql, print)}
    with pytest.raises(SparqlSyntaxError) as error:
        run[request_kind](text)
    assert (
        str(error.value)
        == f"SPARQL syntax error at {where}: the prefix '{prefix}:' is not declared (PREFIX {prefix}: <...>)"
    )


def test_load_is_refused_unless_enabled(engine: Engine) -> None:
    with pytest.raises(InvalidRequest, match="LOAD is disabled"):
        engine.update("LOAD <http://example.org/data.ttl>")


def test_lutt_lookup_cost_is_independent_of_subscriptions() -> None:
    lutt = Lutt()
    for index in range(100_000):
        lutt.add(make_key(DefaultGraph(), node(f"lamp{index}"), node("dim"), None), ("ref", index), None)
    quad = Quad(node("lamp42"), node("dim"), Literal("1"))
    assert lutt.match(quad) == [(("ref", 42), None)]
    assert lutt.match(Quad(node("lamp42"), node("other"), Literal("1"))) == []


def test_lutt_dismisses_quads_of_graphs_no_pattern_names() -> None:
    lutt = Lutt()
    watched, other = node("g1"), node("g2")
    lutt.add(make_key(watched, None, node("dim"), None), "in-g1", None)
    hit, miss = (
        Quad(node("lamp"), node("dim"), Literal("1"), watched),
        Quad(node("lamp"), node("dim"), Literal("1"), other),
    )
    assert lutt.match_all([hit, miss]) == {"in-g1": [(hit, None)]}
    assert lutt.match(miss) == []
    lutt.add(make_key(NAMED, None, node("dim"), None), "any-named", None)
    assert set(lutt.match_all([miss])) == {"any-named"}
    lutt.remove(make_key(NAMED, None, node("dim"), None), "any-named", None)
    lutt.remove(make_key(watched, None, node("dim"), None), "in-g1", None)
    assert lutt.match_all([hit, miss]) == {} and len(lutt) == 0


def test_identical_subscriptions_share_one_spu_and_unsubscribe_frees_it(engine: Engine) -> None:
    seen: list[Notification] = []
    query = f"PREFIX ex: <{EX}> SELECT ?v WHERE {{ ex:lamp1 ex:dim ?v }}"
    first = engine.subscribe(query, seen.append)
    second = engine.subscribe(query, seen.append)
    spu_first = engine.spus.subscriptions[first.spuid][1]
    assert spu_first is engine.spus.subscriptions[second.spuid][1]
    assert isinstance(spu_first, IncrementalSpu)
    assert first.spuid != second.spuid
    entries = len(engine.spus.lutt)
    engine.unsubscribe(first.spuid)
    engine.unsubscribe(second.spuid)
    assert len(engine.spus.lutt) < entries
    assert not engine.spus.groups
    with pytest.raises(NotFound):
        engine.unsubscribe(first.spuid)


def test_same_shape_subscriptions_share_a_group(engine: Engine) -> None:
    seen: list[Notification] = []
    for lamp in ("lamp1", "lamp2"):
        engine.subscribe(f"PREFIX ex: <{EX}> SELECT ?v WHERE {{ ex:{lamp} ex:dim ?v }}", seen.append, alias=lamp)
    assert len(engine.spus.groups) == 1
    engine.update(
        f"PREFIX ex: <{EX}> DELETE {{ ex:lamp2 ex:dim ?v }} INSERT {{ ex:lamp2 ex:dim 99 }} "
        f"WHERE {{ ex:lamp2 ex:dim ?v }}"
    )
    changes = [n for n in seen if n.sequence == 1]
    assert [n.alias for n in changes] == ["lamp2"]
    assert [row[0].value for row in changes[0].added] == ["99"]
    assert [row[0].value for row in changes[0].removed] == ["20"]


def test_filter_constant_tightens_the_lutt(engine: Engine) -> None:
    seen: list[Notification] = []
    engine.subscribe(
        f"PREFIX ex: <{EX}> SELECT ?l ?v WHERE {{ ?l ex:dim ?v . ?r ex:has ?l FILTER(?r = ex:road) }}", seen.append
    )
    result = engine.update(f"PREFIX ex: <{EX}> DELETE DATA {{ ex:lamp2 ex:dim 20 }}")
    assert result.notifications == 0 and result.timings["lutt_hits"] == 0
    result = engine.update(f"PREFIX ex: <{EX}> DELETE DATA {{ ex:lamp1 ex:dim 10 }}")
    assert result.notifications == 1


def test_unsupported_forms_are_reevaluated_exactly(engine: Engine) -> None:
    seen: list[Notification] = []
    subscription = engine.subscribe(
        f"PREFIX ex: <{EX}> SELECT ?l ?r WHERE {{ ?l ex:dim ?v OPTIONAL {{ ?r ex:has ?l }} }}", seen.append
    )
    assert isinstance(engine.spus.subscriptions[subscription.spuid][1], ReevalSpu)
    engine.update(f"PREFIX ex: <{EX}> INSERT DATA {{ ex:road ex:has ex:lamp2 }}")
    assert seen[-1].sequence == 1
    assert {tuple(map(str, row)) for row in seen[-1].added} == {(f"<{EX}lamp2>", f"<{EX}road>")}
    assert {tuple(map(str, row)) for row in seen[-1].removed} == {(f"<{EX}lamp2>", "None")}


def test_construct_cannot_be_subscribed(engine: Engine) -> None:
    with pytest.raises(InvalidRequest):
        engine.subscribe("CONSTRUCT { ?s ?p ?o } WHERE { ?s ?p ?o }", lambda n: None)


def test_on_disk_store_keeps_data_across_reopen(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from broker.store import RdfStore

    store = RdfStore.open(tmp_path / "data")
    engine = Engine(store)
    engine.update(f"PREFIX ex: <{EX}> INSERT DATA {{ GRAPH ex:g {{ ex:a ex:b 1 }} }}")
    store.flush()
    del engine, store
    reopened = Engine(RdfStore.open(tmp_path / "data"))
    assert reopened.query(f"ASK {{ GRAPH <{EX}g> {{ <{EX}a> <{EX}b> 1 }} }}").boolean is True


def test_same_shape_requests_keep_their_own_constants(engine: Engine) -> None:
    """The shape cache swaps IRIs and strings, never datatype IRIs or prefix declarations."""
    xsd_integer = "http://www.w3.org/2001/XMLSchema#integer"
    for value in ("7", "8"):
        result = engine.update(f'INSERT DATA {{ <{EX}s{value}> <{EX}p> "{value}"^^<{xsd_integer}> }}')
        (quad,) = result.added
        assert quad.subject == node(f"s{value}")
        assert quad.object == Literal(value, datatype=NamedNode(xsd_integer))
    result = engine.update(f'DELETE DATA {{ <{EX}s7> <{EX}p> "7"^^<{xsd_integer}> }}')
    assert len(result.removed) == 1


def test_large_requests_are_not_kept_in_the_parse_caches(engine: Engine) -> None:
    from broker.sparql import update_parser

    body = " ".join(f"<{EX}s{index}> <{EX}p> {index} ." for index in range(2000))
    text = f"INSERT DATA {{ {body} }}"
    assert len(text) > update_parser.CACHED_REQUEST_CHARS
    assert len(engine.update(text).added) == 2000
    cached = list(update_parser._TEXTS) + list(update_parser._SHAPES)
    assert all(len(key[0]) <= update_parser.CACHED_REQUEST_CHARS + 100 for key in cached)


def _coalescing(engine: Engine, clock: list[float], dues: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's deferred re-evaluations on a fake clock, their due times kept in `dues`."""
    monkeypatch.setattr(spu_manager, "_now", lambda: clock[0])
    engine.on_deferred(dues.append)


def test_a_coalescing_subscription_is_re_evaluated_once_per_interval(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 updates within one interval: no notification from them; one flush at the due time
    notifies the net change; the first change after a quiet interval is due at once."""
    clock, dues, seen = [100.0], [], []
    _coalescing(engine, clock, dues, monkeypatch)
    sparql = f"PREFIX ex: <{EX}> SELECT ?l ?v WHERE {{ ?l ex:dim ?v }}"
    engine.subscribe(sparql, seen.append, coalesce_s=0.25)
    for value in range(1, 21):
        engine.update(
            f"PREFIX ex: <{EX}> DELETE {{ ex:lamp1 ex:dim ?v }} INSERT {{ ex:lamp1 ex:dim {value} }} "
            f"WHERE {{ ex:lamp1 ex:dim ?v }}"
        )
        clock[0] += 0.001
    assert len(seen) == 1 and dues == [100.25]  # notification 0; due one interval after the subscribe
    assert engine.flush_deferred() == 100.25  # not due yet: nothing done
    clock[0] = 100.25
    assert engine.flush_deferred() is None
    assert len(seen) == 2 and seen[1].sequence == 1
    assert {row[1].value for row in seen[1].added} == {"20"} and {row[1].value for row in seen[1].removed} == {"10"}
    clock[0] = 101.0
    engine.update(f"PREFIX ex: <{EX}> DELETE DATA {{ ex:lamp2 ex:dim 20 }}")
    assert dues[-1] == 101.0  # after a quiet interval: at once


def test_a_coalescing_subscription_that_costs_more_is_re_evaluated_less_often(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most a tenth of the update thread for one SPU: a re-evaluation that took 0.1 s is next due 1 s later."""
    clock, dues = [100.0], []
    _coalescing(engine, clock, dues, monkeypatch)
    sparql = f"PREFIX ex: <{EX}> SELECT ?l ?v WHERE {{ ?l ex:dim ?v }}"
    engine.subscribe(sparql, lambda _notification: None, coalesce_s=0.25)
    (spu,) = engine.spus.reeval.values()
    spu.cost_s = 0.1
    engine.update(f"PREFIX ex: <{EX}> DELETE DATA {{ ex:lamp2 ex:dim 20 }}")
    assert dues == [101.0]


def test_a_new_subscriber_to_a_coalescing_spu_gets_the_result_now(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SPU waits for its re-evaluation when a second subscriber comes: it is re-evaluated then,
    so notification 0 is what the query returns now, and the first subscriber is told the change."""
    clock, dues, first, second = [100.0], [], [], []
    _coalescing(engine, clock, dues, monkeypatch)
    sparql = f"PREFIX ex: <{EX}> SELECT ?l ?v WHERE {{ ?l ex:dim ?v }}"
    engine.subscribe(sparql, first.append, coalesce_s=0.25)
    engine.update(f"PREFIX ex: <{EX}> DELETE DATA {{ ex:lamp2 ex:dim 20 }}")
    engine.subscribe(sparql, second.append, coalesce_s=0.25)
    assert [row[0] for row in second[0].added] == [node("lamp1")]
    assert [row[0] for row in first[1].removed] == [node("lamp2")]
    assert engine.flush_deferred() is None


def test_updates_go_on_while_a_coalescing_subscription_is_re_evaluated(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-evaluation that waits (a query worker compacting its replica answers nothing for ~1 s;
    here a slow evaluation stands for it) holds no update: the flush runs off the update thread,
    and the result it brings is the store as it was when it began, the later change due next."""
    clock, dues, seen = [100.0], [], []
    _coalescing(engine, clock, dues, monkeypatch)
    sparql = f"PREFIX ex: <{EX}> SELECT ?l ?v WHERE {{ ?l ex:dim ?v }}"
    engine.subscribe(sparql, seen.append, coalesce_s=0.25)
    engine.update(f"PREFIX ex: <{EX}> DELETE DATA {{ ex:lamp2 ex:dim 20 }}")
    evaluated = spu_manager.SpuManager._evaluated
    began = threading.Event()

    def slow(manager: spu_manager.SpuManager, spu: ReevalSpu) -> object:
        outcome = evaluated(manager, spu)
        began.set()
        time.sleep(1.0)
        return outcome

    monkeypatch.setattr(spu_manager.SpuManager, "_evaluated", slow)
    clock[0] = 100.25
    flushing = ThreadPoolExecutor(1).submit(engine.flush_deferred)
    assert began.wait(10)
    started = time.monotonic()
    engine.update(f"PREFIX ex: <{EX}> INSERT DATA {{ ex:lamp3 ex:dim 30 }}")
    assert time.monotonic() - started < 0.5  # before: ~1 s, behind the re-evaluation
    assert flushing.result(10) == 100.5  # the insert is due one interval after this re-evaluation
    assert [row[0] for row in seen[1].removed] == [node("lamp2")] and not seen[1].added


def test_a_probe_checks_the_structure_limits_before_rdflib_reads_the_query(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A WebSocket subscribe of a chain of 10,000 `+` was refused after 15-32 s of rdflib's parser
    (the probe read its LUTT patterns first); /query refused it in 8 ms."""
    from broker.core import engine as engine_module
    from broker.errors import InvalidRequest

    read: list[str] = []
    monkeypatch.setattr(engine_module, "query_patterns", lambda text, prefixes=None: read.append(text))
    with pytest.raises(InvalidRequest, match="chains 9999 operators"):
        engine.probe("ASK { FILTER(" + " + ".join(["1"] * 10_000) + " > 0) }")
    assert read == []
    engine.probe("ASK { FILTER(1 + 1 > 0) }")
    assert len(read) == 1


def _view(notifications: list[Notification]) -> list[tuple[str, ...]]:
    """The rows a client holds after applying `notifications` in order, as sorted strings."""
    rows: list[tuple[str, ...]] = []
    for notification in notifications:
        for row in notification.removed:
            rows.remove(tuple(map(str, row)))
        rows += [tuple(map(str, row)) for row in notification.added]
    return sorted(rows)


def test_subscriptions_that_pin_different_variables_do_not_share_a_group(engine: Engine) -> None:
    """Shape.key() left out which variable a FILTER(?v = <iri>) pins: the second query below shared
    the first one's group and was evaluated as ?p = ex:lamp1 (no rows, none notified), and a pin
    added to an unpinned shape crashed the subscribe (zip() of the group's and the query's values)."""
    prologue = f"PREFIX ex: <{EX}> "
    by_predicate = prologue + "SELECT * WHERE { ?s ?p ?o FILTER(?p = ex:dim) }"
    by_subject = prologue + "SELECT * WHERE { ?s ?p ?o FILTER(?s = ex:lamp1) }"
    first: list[Notification] = []
    second: list[Notification] = []
    engine.subscribe(by_predicate, first.append)
    engine.subscribe(by_subject, second.append)
    engine.update(f"PREFIX ex: <{EX}> INSERT DATA {{ ex:lamp1 ex:on true . ex:lamp3 ex:dim 5 }}")
    for query, seen in ((by_predicate, first), (by_subject, second)):
        result = engine.query(query)
        assert _view(seen) == sorted(tuple(map(str, row)) for row in result.rows)
    assert len(_view(second)) == 2
    unpinned = prologue + "SELECT * WHERE { GRAPH ?g { ?s ?p ?o } }"
    pinned = prologue + "SELECT * WHERE { GRAPH ?g { ?s ?p ?o } FILTER(?g = ex:g1) }"
    engine.subscribe(unpinned, lambda n: None)
    graph: list[Notification] = []
    engine.subscribe(pinned, graph.append)
    engine.update(prologue + "INSERT DATA { GRAPH ex:g1 { ex:a ex:b ex:c } GRAPH ex:g2 { ex:a ex:b ex:d } }")
    assert _view(graph) == sorted(tuple(map(str, row)) for row in engine.query(pinned).rows)
    assert len(_view(graph)) == 1


@pytest.mark.parametrize(
    "query",
    ["SELECT ?__sepa_p0 WHERE { ?__sepa_p0 ex:dim 10 }", "SELECT $__sepa_b_x WHERE { _:x ex:has $__sepa_b_x }"],
)
def test_a_variable_named_like_the_shapes_own_is_reevaluated(engine: Engine, query: str) -> None:
    """The shape analyser names its parameters ?__sepa_p0... and blank nodes ?__sepa_b_<label>:
    a query's own variable so named was taken for one (no rows at subscribe, none after), so such
    a query is re-evaluated."""
    query = f"PREFIX ex: <{EX}> {query}"
    seen: list[Notification] = []
    subscription = engine.subscribe(query, seen.append)
    engine.update(f"PREFIX ex: <{EX}> INSERT DATA {{ ex:lamp3 ex:dim 10 . ex:road ex:has ex:lamp3 }}")
    engine.update(f"PREFIX ex: <{EX}> DELETE DATA {{ ex:lamp1 ex:dim 10 . ex:road ex:has ex:lamp1 }}")
    assert _view(seen) == sorted(tuple(map(str, row)) for row in engine.query(query).rows) == [(f"<{EX}lamp3>",)]
    assert isinstance(engine.spus.subscriptions[subscription.spuid][1], ReevalSpu)


@pytest.mark.parametrize("now", ["fn:nowMicros()", "<http://w3id.org/sepa-gateway/fn#nowMicros>()"])
def test_a_filter_on_the_engine_clock_drops_rows_that_expired_at_the_next_update(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, now: str
) -> None:
    """An incremental subscription evaluated its FILTER once per solution and kept the verdict: a
    row of FILTER(?until > now) stayed after its time had passed, the query run again dropping it.
    Such a subscription is re-evaluated at each update its patterns see."""
    clock = [1_000_000_000_000_000_000]  # ns
    monkeypatch.setattr(engine.store.clock, "_source", lambda: clock[0])
    micros = clock[0] // 1000
    query = (
        f"PREFIX ex: <{EX}> PREFIX fn: <http://w3id.org/sepa-gateway/fn#> "
        f"SELECT ?s WHERE {{ ?s ex:until ?until FILTER(?until > {now}) }}"
    )
    engine.update(f"PREFIX ex: <{EX}> INSERT DATA {{ ex:soon ex:until {micros + 1_000_000} }}")
    seen: list[Notification] = []
    engine.subscribe(query, seen.append)
    assert _view(seen) == [(f"<{EX}soon>",)]
    clock[0] += 2_000_000_000
    engine.update(f"PREFIX ex: <{EX}> INSERT DATA {{ ex:later ex:until {micros + 3_600_000_000} }}")
    assert _view(seen) == sorted(tuple(map(str, row)) for row in engine.query(query).rows) == [(f"<{EX}later>",)]


@pytest.mark.parametrize("call", ["NOW()", "RAND()", "UUID()", "STRUUID()", "BNODE()"])
def test_a_filter_on_time_or_chance_is_reevaluated(engine: Engine, call: str) -> None:
    """NOW(), RAND() and fresh identifiers change between evaluations on the same data: the
    verdict an incremental subscription keeps for a solution would go stale (see above)."""
    query = f"PREFIX ex: <{EX}> SELECT ?l WHERE {{ ?l ex:dim ?v FILTER(STR({call}) != STR(?v)) }}"
    subscription = engine.subscribe(query, lambda n: None)
    assert isinstance(engine.spus.subscriptions[subscription.spuid][1], ReevalSpu)


def test_a_prefixed_name_with_an_escape_can_be_subscribed(engine: Engine) -> None:
    """ex:lamp\\-4 is valid SPARQL (a local-name escape) that rdflib reads into an invalid IRI: the
    subscribe of a re-evaluated query failed with a bare ValueError; it is now woken by every update."""
    query = f"PREFIX ex: <{EX}> SELECT (COUNT(*) AS ?n) WHERE {{ ex:lamp\\-4 ex:dim ?v }}"
    seen: list[Notification] = []
    engine.subscribe(query, seen.append)
    engine.update(f"PREFIX ex: <{EX}> INSERT DATA {{ <{EX}lamp-4> ex:dim 40 }}")
    assert _view(seen) == sorted(tuple(map(str, row)) for row in engine.query(query).rows)
    assert [row[0].value for row in engine.query(query).rows] == ["1"]
