"""The lighting benchmark's knowledge base and profiles, checked without the engine.

Why engine-free: the benchmark judges the engine by its notification counts (LAMP 23, ROAD 1,004),
so the profiles themselves must be proven right by plain pyoxigraph evaluation first; otherwise a
wrong count could be the profile's fault as well as the engine's.
"""

from __future__ import annotations

from collections import Counter

import pyoxigraph as ox
import pytest

from tools.lighting import knowledge_base as kb
from tools.lighting import profiles as pr


@pytest.fixture(scope="module")
def quads() -> list[ox.Quad]:
    return list(kb.iter_quads())


def test_table_ii_sizes(quads: list[ox.Quad]) -> None:
    assert kb.N_ROADS == 310
    assert kb.N_POSTS == kb.PAPER_TOTAL_POSTS == 9_500
    assert [(t.lamps, t.roads) for t in kb.ROAD_TYPES] == [(10, 100), (25, 100), (50, 100), (100, 10)]
    assert len(quads) == len(set(quads)) == kb.expected_triple_count()
    assert abs(len(quads) - kb.PAPER_TOTAL_TRIPLES) / kb.PAPER_TOTAL_TRIPLES < 0.005
    for kind in kb.ROAD_TYPES:  # Table II per road type: 35K / 88K / 175K / 35K
        assert abs(kind.posts * kb.TRIPLES_PER_POST - kind.paper_triples) / kind.paper_triples < 0.01
    assert (len(kb.CLASSES), len(kb.INDIVIDUALS)) == (27, 26)
    assert (len(kb.OBJECT_PROPERTIES), len(kb.DATATYPE_PROPERTIES)) == (16, 8)


def test_every_post_has_its_lamp_sensors_and_35_triples(quads: list[ox.Quad]) -> None:
    assert all(len(kb.post_quads(x, y)) == kb.TRIPLES_PER_POST for x, y in [(1, 1), (150, 25), (310, 100)])
    predicates = Counter(q.predicate.value.removeprefix(kb.NS) for q in quads)
    for per_post in (
        "isConnectedTo",
        "hasLamp",
        "hasDimmingValue",
        "hasStatus",
        "hasLampType",
        "hasLatitude",
        "hasLongitude",
        "hasTemperatureSensor",
        "hasPresenceSensor",
    ):
        assert predicates[per_post] == kb.N_POSTS, per_post
    assert predicates["hasMeasure"] == predicates["hasValue"] == kb.N_SENSORS
    dimming = [q.object for q in quads if q.predicate.value == kb.NS + "hasDimmingValue"]
    assert pr.DIMMING_SET_BY_UPDATES not in {d.value for d in dimming}
    assert {d.datatype.value for d in dimming} == {"http://www.w3.org/2001/XMLSchema#string"}


def test_profile_sizes() -> None:
    s = pr.s_profile()
    assert len(s) == 1004
    assert sum(1 for x in s if x.lamp is not None) == 1000
    assert [x.road for x in s if x.lamp is None] == [6, 105, 204, 308]
    assert [x.index for x in s] == list(range(1, 1005))
    assert len({x.sparql for x in s}) == 1004
    per_type = Counter(kb.road_type(x.road).name for x in s if x.lamp is not None)  # Table V
    assert per_type == {"VerySmallRoad": 50, "SmallRoad": 100, "MediumRoad": 150, "LargeRoad": 700}
    monitored = {(x.road, x.lamp) for x in s if x.lamp is not None}
    monitored |= {(x.road, y) for x in s if x.lamp is None for y in range(1, kb.lamps_in_road(x.road) + 1)}
    assert len(monitored) == 1185
    for updates in (pr.u_lamp_profile(), pr.u_road_profile()):
        assert len(updates) == 310 and len({u.sparql for u in updates}) == 310
    everything = pr.all_subscribed_profile()
    assert len(everything) == len({x.sparql for x in everything}) == kb.N_POSTS + kb.N_ROADS


def test_texts_are_valid_sparql() -> None:
    store = ox.Store()  # empty: parsing and running each text is instant
    for update in pr.u_lamp_profile() + pr.u_road_profile():
        assert update.sparql.index("DELETE") < update.sparql.index("INSERT")
        store.update(update.sparql)
    for sub in pr.s_profile():
        assert list(store.query(sub.sparql)) == []
    assert "FILTER(?road = <" + kb.road_uri(7) + ">)" in pr.u_road(7)


@pytest.mark.parametrize(
    ("name", "nu_avg", "lhr", "notifications"), [("LAMP", 1.0, 0.40, 23), ("ROAD", 30.65, 0.72, 1004)]
)
def test_expected_figures_match_the_paper(name: str, nu_avg: float, lhr: float, notifications: int) -> None:
    exp = pr.experiment(name)
    assert (exp.n, exp.m) == (310, 1004)
    assert exp.nu_avg == pytest.approx(nu_avg, abs=0.01)
    assert round(exp.lhr_percent, 2) == lhr
    assert exp.expected_notifications == notifications


def _results(store: ox.Store, sparql: str) -> list[tuple[str, ...]]:
    solutions = store.query(sparql)
    names = solutions.variables
    return sorted(tuple(str(row[v]) for v in names) for row in solutions)


@pytest.mark.parametrize(("name", "fine", "coarse"), [("LAMP", 19, 4), ("ROAD", 1000, 4)])
def test_reevaluation_gives_the_papers_notification_counts(
    quads: list[ox.Quad], name: str, fine: int, coarse: int
) -> None:
    """Apply the real updates with pyoxigraph and re-evaluate the subscription texts.

    After each update only the subscriptions of its road are re-evaluated (each update's WHERE is
    bound to one road); that it touched nothing else is checked by counting "100" values after
    every update and by re-evaluating everything at the end.
    """
    exp = pr.experiment(name)
    store = ox.Store()
    store.extend(quads)
    current = {s.index: _results(store, s.sparql) for s in exp.subscriptions}
    by_road: dict[int, list[pr.SubscriptionSpec]] = {}
    for s in exp.subscriptions:
        by_road.setdefault(s.road, []).append(s)
    count_100 = f'{pr.PREFIX}SELECT (COUNT(*) AS ?n) WHERE {{ ?l ns:hasDimmingValue "100" }}'
    changed_per_update: list[tuple[int, ...]] = []
    set_so_far: set[tuple[int, int]] = set()
    for update in exp.updates:
        store.update(update.sparql)
        set_so_far.update(update.lamps)
        assert int(next(iter(store.query(count_100)))[0].value) == len(set_so_far), update.name
        changed = []
        for s in by_road.get(update.lamps[0][0], []):
            new = _results(store, s.sparql)
            if new != current[s.index]:
                changed.append(s.index)
                current[s.index] = new
        changed_per_update.append(tuple(sorted(changed)))
    assert {s.index: _results(store, s.sparql) for s in exp.subscriptions} == current
    notified = Counter(j for js in changed_per_update for j in js)
    lamp_subs = {s.index for s in exp.subscriptions if s.lamp is not None}
    assert sum(notified.values()) == exp.expected_notifications == fine + coarse
    assert sum(n for j, n in notified.items() if j in lamp_subs) == fine
    assert tuple(changed_per_update) == exp.notified  # the model the runner checks engines against


def test_kpis_follow_table_i() -> None:
    from tools.lighting import kpi

    meas = kpi.Measurements(
        "ROAD",
        "incremental",
        n=310,
        m=1004,
        nu_avg=30.6,
        update_seconds=[0.25] * 310,
        stage_seconds={"t_update_s": 27.125, "t_lutt_s": 2.0, "t_booster_s": 48.0, "t_notify_s": 0.5},
        lutt_hits=2240,
        latencies=[0.002, 0.5],
        notifications=1004,
        expected_notifications=1004,
    )
    k = kpi.compute(meas)
    assert k["t_total_s"] == pytest.approx(77.5)
    assert k["ups"] == pytest.approx(4.0) and k["sps"] == pytest.approx(4016.0)
    assert k["tps"] == pytest.approx(30.6 * 4016.0)
    assert k["e2e"] == pytest.approx((77.5 - 27.125) / 27.125)
    assert (k["nl_min_ms"], k["nl_max_ms"]) == (pytest.approx(2.0), pytest.approx(500.0))
    assert round(k["lhr_percent"], 2) == 0.72 and k["counts_ok"]


def test_cli_registers_the_lighting_bench() -> None:
    from gateway.appliance.cli import build_parser

    args = build_parser().parse_args(["bench", "lighting", "--json", "--modes", "incremental"])
    assert args.json and args.modes == ["incremental"] and args.experiments == ["LAMP", "ROAD"]
    assert callable(args.handler) and not args.all_subscribed
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "lighting", "--experiments", "LAMP,BRIDGE"])
