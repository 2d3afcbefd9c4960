"""Wall-clock limits over real sockets: a never-ending query, subscription or update WHERE is
stopped within its limit plus a second, its client gets a clear error, nothing half-applies, and
other clients are served meanwhile."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable

import aiohttp

from tests.support.bystander import asking_meanwhile, bystander_wait
from tools.launcher import RunningGateway

LIMIT_S = 1.0


def limited(limit_s: float) -> str:
    """The gateway's configuration with a time limit of `limit_s`."""
    return f"[engine]\ntime_limit_s = {limit_s}\nquery_workers = 2\n"


TOML = limited(LIMIT_S)
EX = "http://example.org/"
PRODUCT = " ".join(f"?s{i} ?p{i} ?o{i} ." for i in range(15))  # a cartesian product: never ends
ENDLESS_COUNT = f"SELECT (COUNT(*) AS ?n) WHERE {{ {PRODUCT} }}"


def _seeded(start_gateway: Callable[..., RunningGateway]) -> RunningGateway:
    gateway = start_gateway(toml=TOML)
    assert gateway.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 1, 2, 3 . <{EX}b> <{EX}p> <{EX}a> }}").status == 200
    return gateway


def test_an_endless_query_is_stopped_and_other_clients_are_served(start_gateway) -> None:
    gateway = _seeded(start_gateway)
    with asking_meanwhile(gateway, f"SELECT ?o WHERE {{ <{EX}a> <{EX}p> ?o }}") as other_client:
        started = time.monotonic()
        reply = gateway.query(ENDLESS_COUNT)
        waited = time.monotonic() - started
    latencies = other_client.waits
    assert reply.status == 503 and json.loads(reply.body)["error"] == "timeout", reply.body
    assert LIMIT_S <= waited < LIMIT_S + 1
    # Served meanwhile: most answers as quick as on an idle gateway, and none held for anything
    # near the limit (with one query worker the endless query holds the others ~1 s). A p99
    # under 50 ms failed once on a loaded CI machine (88 ms): the bar is on the median and the
    # maximum, not on the tail one sample makes.
    assert len(latencies) > 20, latencies
    assert statistics.median(latencies) < 0.05 and max(latencies) < LIMIT_S / 2, sorted(latencies)[-5:]
    metrics = gateway.metrics()
    assert metrics["sepa_query_worker_timeouts_total"] == 1
    assert metrics['sepa_errors_total{error="timeout",status="503"}'] == 1


def test_an_update_with_an_endless_where_changes_nothing_and_updates_go_on(start_gateway) -> None:
    gateway = _seeded(start_gateway)
    before = gateway.query("SELECT * WHERE { ?s ?p ?o }", accept="text/csv").body
    update = f"INSERT {{ <{EX}z> <{EX}p> ?n }} WHERE {{ {{ {ENDLESS_COUNT} }} }}"
    started = time.monotonic()
    reply = gateway.update(update)
    assert reply.status == 503 and json.loads(reply.body)["error"] == "timeout", reply.body
    assert time.monotonic() - started < LIMIT_S + 1
    assert gateway.query("SELECT * WHERE { ?s ?p ?o }", accept="text/csv").body == before
    assert gateway.update(f"INSERT DATA {{ <{EX}after> <{EX}p> 1 }}").status == 200


def test_an_endless_subscription_is_an_error_frame_and_the_socket_lives_on(start_gateway) -> None:
    gateway = _seeded(start_gateway)

    async def main() -> tuple[dict, dict]:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"{gateway.ws_url}/subscribe") as ws:
            await ws.send_json({"subscribe": {"sparql": ENDLESS_COUNT, "alias": "endless"}})
            refused = json.loads((await ws.receive(timeout=LIMIT_S + 5)).data)
            await ws.send_json({"subscribe": {"sparql": f"SELECT ?o WHERE {{ <{EX}a> <{EX}p> ?o }}", "alias": "fine"}})
            accepted = json.loads((await ws.receive(timeout=5)).data)
            return refused, accepted

    refused, accepted = asyncio.run(main())
    assert refused["error"] == "timeout" and refused["alias"] == "endless", refused
    assert accepted["notification"]["alias"] == "fine", accepted


def test_a_subscription_the_data_makes_endless_ends_with_an_error_frame(start_gateway) -> None:
    """Its first evaluation is quick (the probe lets it in); an update then makes its
    re-evaluation a cartesian product: it is stopped at the limit, the subscription ends with a
    timeout frame naming it, and the socket and its other subscription live on."""
    gateway = _seeded(start_gateway)
    chain = " ".join(f"?s{i} <{EX}x> ?o{i} ." for i in range(8))
    growing = f"SELECT (COUNT(*) AS ?n) WHERE {{ {chain} }}"
    fine = f"SELECT ?o WHERE {{ <{EX}a> <{EX}p> ?o }}"

    async def main() -> tuple[list[dict], float, int]:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"{gateway.ws_url}/subscribe") as ws:
            for alias, sparql in (("growing", growing), ("fine", fine)):
                await ws.send_json({"subscribe": {"sparql": sparql, "alias": alias}})
                assert "notification" in json.loads((await ws.receive(timeout=10)).data)
            many = " ".join(f"<{EX}n{i}> <{EX}x> {i} ." for i in range(300))
            started = time.monotonic()
            status = (await asyncio.to_thread(gateway.update, f"INSERT DATA {{ {many} }}")).status
            waited = time.monotonic() - started
            frames = [json.loads((await ws.receive(timeout=10)).data)]
            await asyncio.to_thread(gateway.update, f"INSERT DATA {{ <{EX}a> <{EX}p> 4 }}")
            frames.append(json.loads((await ws.receive(timeout=10)).data))
            return frames, waited, status

    (ended, notified), waited, status = asyncio.run(main())
    assert status == 200 and waited < LIMIT_S + 1
    assert ended["error"] == "timeout" and ended["alias"] == "growing" and ended["spuid"], ended
    assert notified["notification"]["alias"] == "fine", notified
    assert gateway.metrics()["sepa_subscriptions_ended_total"] == 1


def test_an_update_whose_plain_bgp_is_a_cartesian_product_is_stopped(start_gateway) -> None:
    """A WHERE of plain triple patterns runs on the update thread, by index lookups: past a step
    budget it goes on in a query worker, where the time limit stops it."""
    gateway = _seeded(start_gateway)
    many = " ".join(f"<{EX}n{i}> <{EX}x> {i} ." for i in range(300))
    assert gateway.update(f"INSERT DATA {{ {many} }}").status == 200
    chain = " ".join(f"?s{i} <{EX}x> ?o{i} ." for i in range(6))
    started = time.monotonic()
    reply = gateway.update(f"DELETE {{ ?s0 <{EX}x> ?o0 }} WHERE {{ {chain} }}")
    assert reply.status == 503 and json.loads(reply.body)["error"] == "timeout", reply.body
    assert time.monotonic() - started < LIMIT_S + 1
    assert gateway.query(f"ASK {{ <{EX}n1> <{EX}x> 1 }}").body.find(b"true") >= 0
    assert gateway.update(f"INSERT DATA {{ <{EX}after> <{EX}p> 1 }}").status == 200


def test_the_time_limit_bounds_a_request_of_many_operations_together(start_gateway) -> None:
    """Each operation's WHERE had the whole limit of its own: one request of 20 operations of
    ~0.2 s each held every other client's updates for seconds. The limit is the request's now.
    A 3 s limit and 300 operations of ~0.025 s (~8 s together): with 1 s and 20 of ~0.2 s, and
    then 3 s and 40 of them, the one operation alone ran past the limit at load 9-13 (2026-12-07:
    503 where 200 was due)."""
    limit_s = 3.0
    gateway = start_gateway(toml=limited(limit_s))
    values = " ".join(str(i) for i in range(50))
    slow = (
        f"SELECT (COUNT(*) AS ?n) WHERE {{ VALUES ?a {{ {values} }} VALUES ?b {{ {values} }} "
        f"VALUES ?c {{ {values} }} FILTER(?a + ?b > ?c) }}"
    )
    one = f"INSERT {{ <{EX}many> <{EX}p> ?n }} WHERE {{ {{ {slow} }} }}"
    started = time.monotonic()
    assert gateway.update(one).status == 200  # one operation alone is well within the limit
    assert time.monotonic() - started < limit_s
    assert gateway.update(f"DELETE WHERE {{ <{EX}many> ?p ?o }}").status == 200
    started = time.monotonic()
    reply = gateway.update(" ;\n".join([one] * 300))
    assert reply.status == 503 and json.loads(reply.body)["error"] == "timeout", reply.body
    assert time.monotonic() - started < limit_s + 1
    assert gateway.query(f"ASK {{ <{EX}many> ?p ?o }}").body.find(b"false") >= 0
    assert gateway.update(f"INSERT DATA {{ <{EX}after> <{EX}p> 1 }}").status == 200


def test_template_tries_that_make_nothing_do_not_hold_other_clients(start_gateway) -> None:
    """An INSERT template of 20,000 patterns over a variable the WHERE never binds, on 1,936 WHERE
    solutions (within max_update_quads): the update thread tried every pattern on every solution,
    counting none, past the time limit (10.5 s with a 3 s limit) while a bystander's one-triple
    update waited. Now refused (400) before any try, nothing applied, the bystander served."""
    gateway = start_gateway(toml=TOML + "max_update_quads = 2000\n")
    values = " ".join(str(i) for i in range(44))
    nothing = " ".join(f"?u{i} <{EX}p> ?x ." for i in range(20_000))
    hostile = f"INSERT {{ {nothing} }} WHERE {{ VALUES ?x {{ {values} }} VALUES ?y {{ {values} }} }}"
    reply, waited = bystander_wait(gateway, hostile)
    assert waited < 2, waited  # 10 s before
    # Refused: 400 naming max_update_quads; or, at load 9-13 (2026-12-07), reading its 20,000
    # patterns took all but 0.05 s of the limit and its WHERE was stopped: 503 timeout. (A 5 s
    # limit instead let the bystander wait 2.6 s behind the reading.)
    refusal = json.loads(reply.body)
    assert (reply.status == 400 and "max_update_quads" in refusal["error_description"]) or (
        reply.status == 503 and refusal["error"] == "timeout"
    ), refusal
    assert gateway.query(f"ASK {{ ?s <{EX}p> 43 }}").body.find(b"false") >= 0


def test_a_long_plain_where_does_not_hold_other_clients_while_it_is_planned(start_gateway) -> None:
    """A WHERE of 4,000 plain triple patterns: the update thread's join planner, quadratic in them,
    ran before the step budget and the time limit (6.97 s with a 3 s limit, a bystander's update
    waiting as long). Now past MAX_PLANNED_PATTERNS it goes to a query worker, under the limit."""
    gateway = _seeded(start_gateway)
    where = " ".join(f"?s{i} <{EX}x> ?o{i} ." for i in range(4000))
    hostile = f"INSERT {{ <{EX}z> <{EX}p> 1 }} WHERE {{ {where} }}"
    reply, waited = bystander_wait(gateway, hostile)
    assert waited < LIMIT_S + 1.5, waited
    assert reply.status in (200, 503), reply.body
