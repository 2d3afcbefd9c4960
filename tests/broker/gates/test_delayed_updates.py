"""Delayed updates over HTTP: `delay` / `at`, 202 + id, GET /scheduled, DELETE /scheduled/{id},
subscriptions notified when they fire, never early, refused when malformed (seed 001 §II-C/D)."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import aiohttp

from gateway.appliance.config import Config
from tests.polling import wait_until
from tools.launcher import InProcessGateway

EX = "http://example.org/"
NOW_MICROS = "<http://w3id.org/sepa-gateway/fn#nowMicros>"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def stamp(name: str) -> str:
    """An update that records when it ran (engine clock, Unix microseconds) under `name`."""
    return f"INSERT {{ <{EX}{name}> <{EX}ranAt> ?t }} WHERE {{ BIND({NOW_MICROS}() AS ?t) }}"


def ran_at(gateway: InProcessGateway, name: str) -> list[int]:
    rows = gateway.select(f"SELECT ?t WHERE {{ <{EX}{name}> <{EX}ranAt> ?t }}")
    return [int(row["t"]) for row in rows]


def due_micros(reply_json: dict) -> int:
    due = datetime.fromisoformat(reply_json["scheduled"]["due"])
    return (due - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def test_a_delayed_update_is_acknowledged_listed_and_runs_at_its_due_time_not_before(in_process_gateway) -> None:
    gateway = in_process_gateway(Config())
    reply = gateway.update(stamp("a"), params={"delay": "400"})
    assert reply.status == 202, reply.body
    scheduled = reply.json()["scheduled"]
    assert set(scheduled) == {"id", "due"} and scheduled["due"].endswith("Z")
    due = due_micros(reply.json())
    assert ran_at(gateway, "a") == []  # not yet
    listed = gateway.request("GET", "/scheduled").json()["scheduled"]
    assert [entry["id"] for entry in listed] == [scheduled["id"]]
    assert listed[0]["update"] == stamp("a") and listed[0]["due"] == scheduled["due"]
    wait_until(lambda: ran_at(gateway, "a") != [])
    (when,) = ran_at(gateway, "a")
    assert when >= due  # the engine clock of the update itself is not before its due time
    assert gateway.request("GET", "/scheduled").json() == {"scheduled": []}
    assert gateway.metrics()["sepa_delayed_fired_total"] == 1


def test_delay_as_iso_duration_in_a_form_body_and_at_as_rfc3339(in_process_gateway) -> None:
    gateway = in_process_gateway(Config())
    body = urlencode({"update": stamp("form"), "delay": "PT0.2S"})
    reply = gateway.request("POST", "/update", body, FORM)
    assert reply.status == 202, reply.body
    past = (datetime.now(UTC) - timedelta(seconds=5)).isoformat().replace("+00:00", "Z")
    reply_at = gateway.update(stamp("past"), params={"at": past})
    assert reply_at.status == 202, reply_at.body
    soon = datetime.now(UTC) + timedelta(milliseconds=300)
    reply_soon = gateway.update(stamp("soon"), params={"at": soon.isoformat()})
    assert reply_soon.status == 202
    wait_until(lambda: ran_at(gateway, "form") and ran_at(gateway, "past") and ran_at(gateway, "soon"))
    assert ran_at(gateway, "soon")[0] >= due_micros(reply_soon.json())
    assert ran_at(gateway, "form")[0] >= due_micros(reply.json())


def test_at_takes_a_lowercase_t_and_z_as_rfc3339_allows(in_process_gateway) -> None:
    """RFC 3339 §5.6: 'T' and 'Z' may be lower case; a lowercase `z` was refused with a 400."""
    gateway = in_process_gateway(Config())
    future = "2030-01-01t00:00:00.25z"
    reply = gateway.update(stamp("later"), params={"at": future})
    assert reply.status == 202, reply.body
    assert reply.json()["scheduled"]["due"] == "2030-01-01T00:00:00.250000Z"
    past = (datetime.now(UTC) - timedelta(seconds=5)).strftime("%Y-%m-%dt%H:%M:%S.%fz")
    reply_past = gateway.update(stamp("past"), params={"at": past})
    assert reply_past.status == 202, reply_past.body
    wait_until(lambda: ran_at(gateway, "past") != [])
    assert ran_at(gateway, "later") == []


def test_malformed_requests_are_refused_when_scheduled_and_change_nothing(in_process_gateway) -> None:
    gateway = in_process_gateway(Config())
    cases = [
        ("INSERT DATA { <a> <b> }", {"delay": "100"}),  # invalid SPARQL: refused now, not when due
        (stamp("x"), {"delay": "soon"}),
        (stamp("x"), {"delay": "-5"}),
        (stamp("x"), {"delay": "P1Y"}),  # years have no fixed length
        (stamp("x"), {"delay": "\u00b2"}),  # a digit to str.isdigit, not to int()
        (stamp("x"), {"delay": "9" * 5000}),  # past int()'s 4,300 digits
        (stamp("x"), {"delay": "PT" + "9" * 400 + "S"}),  # a float's infinity
        (stamp("x"), {"at": "2026-11-22T10:00:00"}),  # no offset
        (stamp("x"), {"at": "tomorrow"}),
        (stamp("x"), {"at": "2026-11-22 10:00:00z"}),  # a lowercase z, but no T
        (stamp("x"), {"at": "2026-11-22T10:00:00zz"}),
        (stamp("x"), {"at": "2026-11-22T10:00:00+01:00z"}),
        (stamp("x"), {"at": "0001-01-01T00:00:00+23:59"}),  # year 0 in UTC: it was stored, then a 500
        (stamp("x"), {"at": "20301122T100000Z"}),  # ISO 8601's basic form, not RFC 3339
        (stamp("x"), {"at": "2030-W01-1T10:00:00Z"}),  # a week date
        (stamp("x"), {"at": "2030-11-22T10Z"}),  # no minutes
        (stamp("x"), {"at": "２０３０-11-22T10:00:00Z"}),  # fullwidth digits
        (stamp("x"), {"delay": "PT３０S"}),
        (stamp("x"), {"delay": "100", "at": "2026-11-22T10:00:00Z"}),
        (f"LOAD <{EX}doc>", {"delay": "100"}),  # LOAD is off by default
    ]
    for sparql, params in cases:
        reply = gateway.update(sparql, params=params)
        assert reply.status == 400, (sparql, params, reply.body)
        assert reply.json()["error"] == "invalid_request"
    twice = gateway.update(stamp("x"), params=[("delay", "100"), ("delay", "200")])
    assert twice.status == 400
    assert gateway.request("GET", "/scheduled").json() == {"scheduled": []}
    time.sleep(0.3)
    assert ran_at(gateway, "x") == []
    assert gateway.metrics()['sepa_errors_total{error="invalid_request",status="400"}'] == len(cases) + 1


def test_a_cancelled_update_never_runs_and_unknown_ids_are_404(in_process_gateway) -> None:
    gateway = in_process_gateway(Config())
    keep = gateway.update(stamp("keep"), params={"delay": "300"}).json()["scheduled"]
    drop = gateway.update(stamp("drop"), params={"delay": "300"}).json()["scheduled"]
    reply = gateway.request("DELETE", f"/scheduled/{drop['id']}")
    assert reply.status == 200 and reply.json() == {"cancelled": drop}
    assert [entry["id"] for entry in gateway.request("GET", "/scheduled").json()["scheduled"]] == [keep["id"]]
    again = gateway.request("DELETE", f"/scheduled/{drop['id']}")
    assert again.status == 404 and again.json()["error"] == "not_found"
    assert gateway.request("DELETE", "/scheduled/no-such-id").status == 404
    wait_until(lambda: ran_at(gateway, "keep") != [])
    time.sleep(0.2)
    assert ran_at(gateway, "drop") == []
    assert gateway.request("DELETE", f"/scheduled/{keep['id']}").status == 404  # already ran


def test_updates_due_together_run_in_due_order_then_scheduling_order(in_process_gateway) -> None:
    gateway = in_process_gateway(Config())
    at = (datetime.now(UTC) + timedelta(milliseconds=400)).isoformat()
    later = (datetime.now(UTC) + timedelta(milliseconds=450)).isoformat()
    set_value = (
        "DELETE {{ <{ex}x> <{ex}v> ?o }} INSERT {{ <{ex}x> <{ex}v> {n} }} WHERE {{ OPTIONAL {{ <{ex}x> <{ex}v> ?o }} }}"
    )
    assert gateway.update(set_value.format(ex=EX, n=3), params={"at": later}).status == 202
    for n in (1, 2):
        assert gateway.update(set_value.format(ex=EX, n=n), params={"at": at}).status == 202
    wait_until(lambda: gateway.request("GET", "/scheduled").json() == {"scheduled": []})
    assert gateway.select(f"SELECT ?v WHERE {{ <{EX}x> <{EX}v> ?v }}") == [{"v": "3"}]


def test_subscribers_are_notified_when_a_delayed_update_fires(in_process_gateway) -> None:
    gateway = in_process_gateway(Config())

    async def scenario() -> list[dict]:
        async with aiohttp.ClientSession() as session, session.ws_connect(gateway.ws_url + "/subscribe") as ws:
            query = f"SELECT ?t WHERE {{ <{EX}lamp> <{EX}ranAt> ?t }}"
            await ws.send_str(json.dumps({"subscribe": {"sparql": query, "alias": "lamp"}}))
            first = json.loads((await ws.receive(timeout=10)).data)
            loop = asyncio.get_running_loop()
            reply = await loop.run_in_executor(None, lambda: gateway.update(stamp("lamp"), params={"delay": "200"}))
            assert reply.status == 202
            second = json.loads((await ws.receive(timeout=10)).data)
            return [first, second]

    first, second = asyncio.run(scenario())
    assert first["notification"]["sequence"] == 0
    assert first["notification"]["addedResults"]["results"]["bindings"] == []
    notification = second["notification"]
    assert notification["sequence"] == 1 and notification["alias"] == "lamp"
    (binding,) = notification["addedResults"]["results"]["bindings"]
    assert int(binding["t"]["value"]) >= 0


def test_the_pending_table_is_bounded(in_process_gateway) -> None:
    config = Config()
    config.scheduler.max_pending = 2
    gateway = in_process_gateway(config)
    for name in ("one", "two"):
        assert gateway.update(stamp(name), params={"delay": "60000"}).status == 202
    reply = gateway.update(stamp("three"), params={"delay": "60000"})
    assert reply.status == 429 and reply.json()["error"] == "too_many_requests"
    assert len(gateway.request("GET", "/scheduled").json()["scheduled"]) == 2


def test_cancelled_updates_do_not_stay_in_memory_until_their_due_time(in_process_gateway) -> None:
    """Schedule ten years ahead, cancel, again: the limits count pending updates only, so a cancelled
    one must not be kept either. Before, the timer's heap kept every cancelled update (and its text)
    until its due time: 400 cycles of a 100 kB update held 400 entries, 40 MB, for up to ten years."""
    gateway = in_process_gateway(Config())
    delayed = gateway.gateway.scheduler.delayed
    padding = "#" + "x" * 100_000 + "\n"
    for number in range(400):
        reply = gateway.update(padding + stamp(f"c{number}"), params={"delay": "P3650D"})
        assert reply.status == 202, reply.body
        assert gateway.request("DELETE", f"/scheduled/{reply.json()['scheduled']['id']}").status == 200
    assert gateway.request("GET", "/scheduled").json() == {"scheduled": []}
    held = gateway.call(asyncio.sleep(0, len(delayed._heap)))
    assert held <= 64, f"{held} cancelled updates still held by the timer"
    reply = gateway.update(stamp("after"), params={"delay": "100"})  # the timer still runs what is due
    assert reply.status == 202
    wait_until(lambda: ran_at(gateway, "after") != [])


def test_the_list_comes_a_page_at_a_time_and_a_page_goes_on_after_its_last_update_is_gone(
    in_process_gateway,
) -> None:
    """GET /scheduled held every pending update in one reply (up to max_pending_bytes of SPARQL).
    `limit` and `after` page it; `next` says more follow; a short list is the reply it always was."""
    gateway = in_process_gateway(Config())
    replies = [gateway.update(stamp(f"p{n}"), params={"delay": str(60_000 + n)}) for n in range(5)]
    ids = [reply.json()["scheduled"]["id"] for reply in replies]
    assert set(gateway.request("GET", "/scheduled").json()) == {"scheduled"}  # no `next`: all of it
    first = gateway.request("GET", "/scheduled", params={"limit": "2"}).json()
    assert [entry["id"] for entry in first["scheduled"]] == ids[:2] and "next" in first
    assert gateway.request("DELETE", f"/scheduled/{ids[1]}").status == 200  # the page's last is gone
    second = gateway.request("GET", "/scheduled", params={"limit": "2", "after": first["next"]}).json()
    assert [entry["id"] for entry in second["scheduled"]] == ids[2:4] and "next" in second
    third = gateway.request("GET", "/scheduled", params={"limit": "2", "after": second["next"]}).json()
    assert third == {"scheduled": [gateway.request("GET", "/scheduled").json()["scheduled"][-1]]}
    assert third["scheduled"][0]["id"] == ids[4]
    for params in ({"limit": "0"}, {"limit": "1001"}, {"limit": "x"}, {"limit": "9" * 50}, {"after": ids[0]}):
        reply = gateway.request("GET", "/scheduled", params=params)
        assert reply.status == 400 and reply.json()["error"] == "invalid_request", params


def test_a_long_list_is_a_thousand_updates_a_page_by_default(in_process_gateway) -> None:
    gateway = in_process_gateway(Config())
    for n in range(1001):
        assert gateway.update(stamp(f"q{n}"), params={"delay": str(60_000 + n)}).status == 202
    first = gateway.request("GET", "/scheduled").json()
    assert len(first["scheduled"]) == 1000
    rest = gateway.request("GET", "/scheduled", params={"after": first["next"]}).json()
    assert len(rest["scheduled"]) == 1 and "next" not in rest
    assert rest["scheduled"][0]["update"] == stamp("q1000")


def test_an_update_due_in_the_past_is_not_counted_late_by_centuries(in_process_gateway) -> None:
    """Lateness counts from the due time, or from when the update was scheduled if that was later:
    `at=0001-01-01T00:00:00Z` made sepa_delayed_lateness_max_seconds 63,932,092,480."""
    gateway = in_process_gateway(Config())
    reply = gateway.update(stamp("past"), params={"at": "0001-01-01T00:00:00Z"})
    assert reply.status == 202, reply.body
    wait_until(lambda: ran_at(gateway, "past") != [])
    metrics = gateway.metrics()
    assert metrics["sepa_delayed_fired_total"] == 1
    assert 0 <= metrics["sepa_delayed_lateness_max_seconds"] < 60
