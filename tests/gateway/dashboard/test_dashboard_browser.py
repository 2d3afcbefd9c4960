"""The dashboard in real Chromium against a gateway started as the installed service starts it
(systemd/sepa-gateway.toml: HTTPS + WSS with OAuth, plain gates on loopback, MQTT through a
Mosquitto that wants logins; clients made with `sepa-gateway clients add --register`).

The browser trusts the gateway's generated certificate by its key (tools.browser.trusting), as an
operator does by importing tls-cert.pem. Screenshots go to the `artifacts` folder listed at the end
of the run (tests/support/artifacts.py).
"""

from __future__ import annotations

import json
import re
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from selenium.webdriver.common.action_chains import ActionChains

from tests.gateway.dashboard.dashboard_support import (
    CONSOLE_ROWS,
    SHOWN_ROWS,
    SL,
    TILE_VALUE,
    lamp_state,
    lamp_update,
    log_in,
    tile_value,
    wait_for,
    wait_until_live,
)
from tests.support.browser import chromium, console_errors, trusting
from tools.dashboard_bench.installed import SENSOR, Credentials, InstalledGateway, installed_gateway
from tools.dashboard_bench.runner import FIRST_PAINT, PAGE_WEIGHT

GW = "http://w3id.org/sepa-gateway/ns#"
PAGE_WEIGHT_LIMIT = 300 * 1024
FIRST_RENDER_LIMIT_MS = 1000
READING_LATENCY_LIMIT_MS = 1000


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InstalledGateway]:
    with installed_gateway(tmp_path_factory.mktemp("installed")) as running:
        yield running


@pytest.fixture(scope="module")
def writer(installed: InstalledGateway) -> Credentials:
    return installed.register("dashboard", read=("*",), write=("*",))


@pytest.fixture(scope="module")
def viewer(installed: InstalledGateway) -> Credentials:
    return installed.register("viewer", read=("*",))


@pytest.fixture(scope="module")
def browser(installed: InstalledGateway, writer: Credentials) -> Iterator[Any]:
    """One Chromium logged in as the client that may write, shared by the module's tests."""
    with chromium(flags=trusting(installed.certificate)) as driver:
        log_in(driver, installed.gateway.https_url, writer)
        yield driver


@pytest.fixture(scope="module")
def sensor(installed: InstalledGateway) -> Iterator[mqtt.Client]:
    """A sensor's MQTT connection, with the login `sepa-gateway sensors add` printed for it."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"dash-{uuid.uuid4().hex[:8]}")
    client.username_pw_set(SENSOR, installed.sensor_password)
    client.connect("127.0.0.1", installed.broker.port)
    client.loop_start()
    yield client
    client.disconnect()
    client.loop_stop()


def publish(client: mqtt.Client, topic: str, value: str) -> None:
    client.publish(topic, value, qos=1).wait_for_publish(10)


def test_the_page_loads_without_console_errors_within_its_weight_and_first_render(
    installed: InstalledGateway, writer: Credentials
) -> None:
    with chromium(flags=trusting(installed.certificate)) as driver:
        driver.get(installed.gateway.https_url + "/")
        wait_for(driver, "return !document.getElementById('login').hidden", what="the login form")
        time.sleep(0.3)  # the last resources' timings
        weight = driver.execute_script(PAGE_WEIGHT)
        names = [name for name, _ in weight]
        assert any(name.endswith("uPlot.iife.min.js") for name in names), names  # everything loaded is counted
        assert all(size > 0 for _, size in weight), weight  # a cold cache: every byte came over the wire
        total = sum(size for _, size in weight)
        assert total <= PAGE_WEIGHT_LIMIT, (total, weight)
        log_in(driver, installed.gateway.https_url, writer)
        driver.refresh()  # loaded again, with the token kept in sessionStorage: straight to the tiles
        wait_until_live(driver)
        paint = driver.execute_script(FIRST_PAINT)
        assert paint and paint[0] <= FIRST_RENDER_LIMIT_MS, paint
        for panel in ("console-panel", "scheduled-panel", "mappings-panel"):
            driver.find_element("css selector", f"#{panel} > summary").click()
        time.sleep(1.5)  # the panels' first requests and subscriptions, a metrics poll
        assert console_errors(driver) == []
        print(f"page weight {total} bytes transferred, first contentful paint {paint[0]:.0f} ms")


def test_the_page_keeps_no_re_evaluation_worker_busy(browser: Any, installed: InstalledGateway) -> None:
    """Every subscription the page makes by itself (tiles, mapping lists, actuators) is one the
    engine keeps incrementally. A re-evaluated one (OPTIONAL...) would wake the gateway's
    re-evaluation worker, a process replaying every delta of the store while the page is open."""
    open_panel(browser, "mappings-panel")
    wait_for(browser, "return document.querySelector('#mappings table') !== null", what="the mappings list")
    wait_for(browser, "return document.querySelector('#coap-observations table') !== null", what="the CoAP list")
    assert installed.gateway.metric("sepa_subscriptions") >= 4
    assert installed.gateway.metric("sepa_reeval_worker_woken_total") == 0


def test_the_token_is_kept_for_the_tab_only_and_neither_it_nor_the_secret_is_logged(
    browser: Any, installed: InstalledGateway, writer: Credentials
) -> None:
    kept = browser.execute_script("return sessionStorage.getItem('sepa-dashboard-token')")
    assert kept and writer.client_secret not in kept
    token = json.loads(kept)["value"]
    assert browser.execute_script("return localStorage.length") == 0
    assert browser.execute_script("return document.cookie") == ""
    log = installed.gateway.log()
    assert writer.client_secret not in log and token not in log


def test_a_reading_over_mqtt_shows_in_its_tile_and_chart_within_a_second(browser: Any, sensor: mqtt.Client) -> None:
    publish(sensor, "gateway/dash-boiler/temperature", "20.25")
    wait_for(browser, "return document.querySelector('.tile .value') !== null", what="a tile")
    assert wait_for(
        browser,
        "const t = [...document.querySelectorAll('.tile')].find((t) => t.querySelector('.sensor').textContent === "
        "'dash-boiler'); if (t) t.click(); return !!t;",
        what="the tile of dash-boiler",
    )
    wait_for(browser, "return document.getElementById('chart').dataset.last === '20.25'", what="the chart's history")
    browser.execute_script(
        "window.seen = {};"
        "const check = () => {"
        "  const t = [...document.querySelectorAll('.tile')].find((t) => t.querySelector('.sensor').textContent === "
        "'dash-boiler');"
        "  if (t && t.querySelector('.value').textContent === '63.5') window.seen.tile ??= Date.now();"
        "  if (document.getElementById('chart').dataset.last === '63.5') window.seen.chart ??= Date.now();"
        "};"
        "new MutationObserver(check).observe(document.body, "
        "{subtree: true, childList: true, characterData: true, attributes: true});"
    )
    sent_ms = time.time() * 1000
    publish(sensor, "gateway/dash-boiler/temperature", "63.5")
    seen = wait_for(browser, "return window.seen.tile && window.seen.chart && window.seen", what="63.5 shown")
    assert seen["tile"] - sent_ms <= READING_LATENCY_LIMIT_MS, seen["tile"] - sent_ms
    assert seen["chart"] - sent_ms <= READING_LATENCY_LIMIT_MS, seen["chart"] - sent_ms
    print(f"publish to tile {seen['tile'] - sent_ms:.0f} ms, to chart {seen['chart'] - sent_ms:.0f} ms")
    assert tile_value(browser, "dash-boiler", "temperature") == "63.5"
    points = int(browser.execute_script("return document.getElementById('chart').dataset.points"))
    assert points >= 2  # the history point and the live one


def test_a_fast_sensor_is_shown_from_coalesced_notifications(browser: Any, sensor: mqtt.Client) -> None:
    """The tiles' subscription asks for one notification per 250 ms at most (coalesce_ms): 20
    readings 20 ms apart reach the chart, which takes one point per notification, as a handful of
    points (one per reading without it), and the tile and chart end on the last value."""
    publish(sensor, "gateway/dash-fast/temperature", "1")
    assert wait_for(
        browser,
        "const t = [...document.querySelectorAll('.tile')].find((t) => t.querySelector('.sensor').textContent === "
        "'dash-fast'); if (t) t.click(); return !!t;",
        what="the tile of dash-fast",
    )
    wait_for(browser, "return document.getElementById('chart').dataset.last === '1'", what="the chart of dash-fast")
    time.sleep(0.5)
    before = int(browser.execute_script("return document.getElementById('chart').dataset.points"))
    started = time.monotonic()
    for value in range(2, 22):
        publish(sensor, "gateway/dash-fast/temperature", str(value))
        time.sleep(0.02)
    span = time.monotonic() - started  # ~0.5 s; more on a loaded machine (the full suite failed once at <= 4)
    wait_for(browser, "return document.getElementById('chart').dataset.last === '21'", what="the last reading")
    time.sleep(0.6)  # anything still held would come by now
    added = int(browser.execute_script("return document.getElementById('chart').dataset.points")) - before
    # one notification per 250 ms of the span, one more at each end; 20 without coalescing
    assert 1 <= added <= min(10, int(span / 0.25) + 2), (added, span)
    assert tile_value(browser, "dash-fast", "temperature") == "21"


def test_a_sensor_that_stops_is_marked_stale_after_its_periods_and_fresh_again(
    browser: Any, sensor: mqtt.Client
) -> None:
    """Stale = no reading for 3 periods (config stale_periods), the period learned from the sensor's
    own readings: a sensor publishing every 0.3 s is stale within about a second of its last reading."""
    stale = (
        "const t = [...document.querySelectorAll('.tile')].find((t) => t.querySelector('.sensor').textContent === "
        "'pulse'); return t ? t.classList.contains('stale') : null;"
    )
    for value in range(6):
        publish(sensor, "gateway/pulse/temperature", f"{value}.5")
        time.sleep(0.3)
        if value >= 2:
            assert browser.execute_script(stale) is False  # readings keep coming: fresh
    stopped = time.monotonic()
    wait_for(browser, stale, timeout=10, what="the pulse sensor marked stale")
    assert time.monotonic() - stopped <= 3.5  # 3 periods of 0.3 s (1 s at least), seen by a 1 s check
    publish(sensor, "gateway/pulse/temperature", "9.5")
    wait_for(browser, stale.replace("? t.classList", "? !t.classList"), what="the pulse sensor fresh again")


def test_a_result_time_that_is_not_a_time_does_not_stop_the_stale_marking(
    browser: Any, installed: InstalledGateway, sensor: mqtt.Client
) -> None:
    """A latest node whose gw:resultTime is not a time (a client that may write the latest view can
    write one): its NaN became the page's estimate of the gateway's clock (the highest offset seen,
    and NaN wins every Math.max), so no tile was marked stale until a reading came 10-20 s later,
    and pointing at its tile threw. Now such a time is not a reading."""
    latest = "http://w3id.org/sepa-gateway/graph/latest"
    node = "urn:dash:latest:bad-time"
    bad = (
        f"<{node}> <{GW}sensor> <urn:s:bad-time> ; <{GW}property> <urn:p:temperature> ; "
        f'<{GW}value> 1.0 ; <{GW}resultTime> "not a time"'
    )
    stale = (
        "const t = [...document.querySelectorAll('.tile')].find((t) => t.querySelector('.sensor').textContent === "
        "'after-bad-time'); return t ? t.classList.contains('stale') : null;"
    )
    console_errors(browser)  # the earlier tests'
    publish(sensor, "gateway/after-bad-time/temperature", "0.5")  # the tiles' view is live: the node comes as a change
    wait_for(browser, f"return {TILE_VALUE} === '0.5'", "after-bad-time", "temperature", what="the first reading")
    assert installed.gateway.update(f"INSERT DATA {{ GRAPH <{latest}> {{ {bad} }} }}").status == 200
    try:
        wait_for(browser, f"return {TILE_VALUE} !== null", "bad-time", "temperature", what="the tile")
        for value in range(6):
            publish(sensor, "gateway/after-bad-time/temperature", f"{value}.5")
            time.sleep(0.3)
        stopped = time.monotonic()
        wait_for(browser, stale, timeout=10, what="the sensor marked stale")
        assert time.monotonic() - stopped <= 3.5
        tile = browser.find_element("css selector", ".tile[data-sensor='urn:s:bad-time']")
        ActionChains(browser).move_to_element(tile).perform()
        assert wait_for(browser, "return arguments[0].title", tile, what="the tooltip").startswith("urn:s:bad-time")
        assert console_errors(browser) == []
    finally:  # the other tests' pages must not meet it
        assert installed.gateway.update(f"DELETE WHERE {{ GRAPH <{latest}> {{ <{node}> ?p ?o }} }}").status == 200


def test_a_value_that_is_a_triple_term_is_shown_as_one(browser: Any, installed: InstalledGateway) -> None:
    """A latest node's gw:value that is an RDF 1.2 triple term showed "[object Object]" in its tile."""
    latest = "http://w3id.org/sepa-gateway/graph/latest"
    node = "urn:dash:latest:triple"
    time_ = '"2026-01-01T00:00:00Z"^^<http://www.w3.org/2001/XMLSchema#dateTime>'
    update = (
        f"INSERT {{ GRAPH <{latest}> {{ <{node}> <{GW}sensor> <urn:s:triple-value> ; <{GW}property> <urn:p:t> ; "
        f"<{GW}value> ?v ; <{GW}resultTime> {time_} }} }} WHERE {{ BIND(TRIPLE(<urn:a>, <urn:b>, 7) AS ?v) }}"
    )
    assert installed.gateway.update(update).status == 200
    try:
        shown = wait_for(browser, f"return {TILE_VALUE}", "triple-value", "t", what="the tile")
        assert shown == '<<( <urn:a> <urn:b> "7"^^<integer> )>>'
    finally:  # the other tests' pages must not meet it
        assert installed.gateway.update(f"DELETE WHERE {{ GRAPH <{latest}> {{ <{node}> ?p ?o }} }}").status == 200


def test_the_clock_estimate_follows_a_step_of_the_browsers_clock(browser: Any, sensor: mqtt.Client) -> None:
    """The page judges staleness by its estimate of the gateway's clock. The browser's clock stepped
    an hour forward (as the gateway's stepped back): the estimate was the highest offset ever seen,
    so it stayed an hour ahead and a sensor publishing every 0.3 s was marked stale again at every
    check; now the best offset of the last 10-20 s is taken, and the tile is fresh again."""
    stale = (
        "const t = [...document.querySelectorAll('.tile')].find((t) => t.querySelector('.sensor').textContent === "
        "'stepped'); return t ? t.classList.contains('stale') : null;"
    )
    browser.execute_script(
        "window.realNow = window.realNow || Date.now.bind(Date); Date.now = () => window.realNow() + 3600000;"
    )
    try:
        deadline = time.monotonic() + 45
        fresh = 0
        while fresh < 10:  # 3 s of readings every 0.3 s, at least two of the page's 1 s checks
            assert time.monotonic() < deadline, "the tile stayed stale after the browser's clock stepped"
            publish(sensor, "gateway/stepped/temperature", "1.5")
            time.sleep(0.3)
            fresh = fresh + 1 if browser.execute_script(stale) is False else 0
    finally:
        browser.execute_script("Date.now = window.realNow;")


def test_a_console_subscription_shows_added_and_removed_rows(browser: Any, installed: InstalledGateway) -> None:
    subject = f"urn:dash:{uuid.uuid4().hex[:8]}"
    console_run(browser, f"SELECT ?o WHERE {{ <{subject}> <urn:dash:p> ?o }}", "run-subscribe")
    wait_for(browser, CONSOLE_ROWS, subject, "table.current", what="the console subscription")

    def rows(selector: str) -> list[str]:
        return [text for text in browser.execute_script(CONSOLE_ROWS, subject, selector) if "hello" in text]

    def until(selector: str, expected: list[str]) -> None:
        deadline = time.monotonic() + 10
        while rows(selector) != expected:
            assert time.monotonic() < deadline, (selector, rows(selector))
            time.sleep(0.02)

    assert installed.gateway.update(f'INSERT DATA {{ <{subject}> <urn:dash:p> "hello" }}').status == 200
    until("table.changes tr.row-added", ['"hello"'])
    until("table.current tbody tr", ['"hello"'])
    assert installed.gateway.update(f'DELETE DATA {{ <{subject}> <urn:dash:p> "hello" }}').status == 200
    until("table.changes tr.row-removed", ['"hello"'])
    until("table.current tbody tr", [])
    assert rows("table.changes tr.row-added") == ['"hello"']  # the change log keeps both


def test_a_console_subscription_keeps_rows_that_differ_only_in_a_datatype_a_language_or_a_separator(
    browser: Any, installed: InstalledGateway
) -> None:
    """A row was known by its terms' types and values joined with U+0001: "21" as an integer, a double
    and in English were one row (counted once, and the double's removal left its text shown), and so
    were two rows whose values a sensor split at U+0001 differently ("v" + "w\\u0001literal:z" and
    "v\\u0001literal:w" + "z")."""
    subject = f"urn:dash:{uuid.uuid4().hex[:8]}"
    pairs = {
        "int": ('"21"^^<http://www.w3.org/2001/XMLSchema#integer>', '"x"'),
        "double": ('"21"^^<http://www.w3.org/2001/XMLSchema#double>', '"x"'),
        "en": ('"21"@en', '"x"'),
        "left": ('"v\\u0001literal:w"', '"z"'),
        "right": ('"v"', '"w\\u0001literal:z"'),
    }
    triples = " ".join(
        f"<{subject}:{name}> <urn:dash:in> <{subject}> ; <urn:dash:a> {a} ; <urn:dash:b> {b} ."
        for name, (a, b) in pairs.items()
    )
    console_run(
        browser,
        f"SELECT ?a ?b WHERE {{ ?n <urn:dash:in> <{subject}> ; <urn:dash:a> ?a ; <urn:dash:b> ?b }}",
        "run-subscribe",
    )
    wait_for(browser, CONSOLE_ROWS, subject, "table.current", what="the console subscription")
    assert installed.gateway.update(f"INSERT DATA {{ {triples} }}").status == 200

    def current() -> list[str]:
        return sorted(browser.execute_script(CONSOLE_ROWS, subject, "table.current tbody tr"))

    def until(expected: list[str]) -> None:
        deadline = time.monotonic() + 10
        while current() != expected:
            assert time.monotonic() < deadline, current()
            time.sleep(0.02)

    shown = {
        "int": '"21"^^<integer>"x"',
        "double": '"21"^^<double>"x"',
        "en": '"21"@en"x"',
        "left": '"v\u0001literal:w""z"',
        "right": '"v""w\u0001literal:z"',
    }
    until(sorted(shown.values()))
    assert browser.execute_script(CONSOLE_ROWS, subject, "h4")[0] == f"Current rows ({len(pairs)})"
    double = f"<{subject}:double> <urn:dash:a> {pairs['double'][0]}"
    assert installed.gateway.update(f"DELETE DATA {{ {double} }}").status == 200
    until(sorted(text for name, text in shown.items() if name != "double"))


def test_a_console_subscription_shows_triple_terms_as_triples(browser: Any, installed: InstalledGateway) -> None:
    """An RDF 1.2 triple term (an update's TRIPLE() stores one) was shown "[object Object]" (its JSON
    value is an object), and every triple term in a column was one row."""
    subject = f"urn:dash:{uuid.uuid4().hex[:8]}"
    console_run(browser, f"SELECT ?o WHERE {{ <{subject}> <urn:dash:t> ?o }}", "run-subscribe")
    wait_for(browser, CONSOLE_ROWS, subject, "table.current", what="the console subscription")
    made = ('TRIPLE(<urn:a>, <urn:b>, "x"@en)', "TRIPLE(<urn:a>, <urn:b>, TRIPLE(<urn:c>, <urn:d>, <urn:e>))")
    for term in made:
        update = f"INSERT {{ <{subject}> <urn:dash:t> ?o }} WHERE {{ BIND({term} AS ?o) }}"
        assert installed.gateway.update(update).status == 200
    expected = sorted(['<<( <urn:a> <urn:b> "x"@en )>>', "<<( <urn:a> <urn:b> <<( <urn:c> <urn:d> <urn:e> )>> )>>"])
    deadline = time.monotonic() + 10
    while (shown := sorted(browser.execute_script(CONSOLE_ROWS, subject, "table.current tbody tr"))) != expected:
        assert time.monotonic() < deadline, shown
        time.sleep(0.02)
    console_run(browser, f"SELECT ?o WHERE {{ <{subject}> <urn:dash:t> ?o }}", "run-query")
    rows = "return [...document.querySelectorAll('#console-result tbody tr')].map((r) => r.textContent)"
    assert sorted(wait_for(browser, rows, what="the query's rows")) == expected


def test_a_console_table_draws_its_first_rows_and_counts_the_rest(browser: Any, installed: InstalledGateway) -> None:
    """A subscription may hold 100,000 rows: drawing 30,000 took the page 13 s at every notification."""
    subject = f"urn:dash:{uuid.uuid4().hex[:8]}"
    rows = SHOWN_ROWS + 100
    triples = " ".join(f'<{subject}> <urn:dash:many> "v{index}" .' for index in range(rows))
    assert installed.gateway.update(f"INSERT DATA {{ {triples} }}").status == 200
    console_run(browser, f"SELECT ?o WHERE {{ <{subject}> <urn:dash:many> ?o }}", "run-subscribe")
    note = f"const rows = (() => {{ {CONSOLE_ROWS} }})(); return rows && rows.length"
    wait_for(browser, note, subject, ".rows-left-out", what="the note of the rows left out")
    assert len(browser.execute_script(CONSOLE_ROWS, subject, "table.current tbody tr")) == SHOWN_ROWS
    note = browser.execute_script(CONSOLE_ROWS, subject, ".rows-left-out")
    assert note == [f"{rows} rows: the first {SHOWN_ROWS} are shown"]
    browser.find_element("id", "run-query").click()
    wait_for(
        browser, "return document.querySelector('#console-result .rows-left-out')?.textContent", what="the query's note"
    )
    assert len(browser.find_elements("css selector", "#console-result table tbody tr")) == SHOWN_ROWS


def test_a_sensor_iri_with_an_escape_that_is_not_utf8_stops_no_tile(
    browser: Any, installed: InstalledGateway, sensor: mqtt.Client
) -> None:
    """urn:s:bad%E0 is a legal IRI; decoding its name threw, and every tile drawn after it froze."""
    publish(sensor, "gateway/escape-check/temperature", "1.5")
    wait_for(browser, f"return {TILE_VALUE} === '1.5'", "escape-check", "temperature", what="the first reading")
    latest = "http://w3id.org/sepa-gateway/graph/latest"
    gw = "http://w3id.org/sepa-gateway/ns#"
    node = "urn:dash:latest:bad"
    bad = (
        f"<{node}> <{gw}sensor> <urn:s:bad%E0> ; <{gw}property> <urn:p:t%E0> ; <{gw}unit> <urn:u:%E0> ; "
        f'<{gw}value> 1.0 ; <{gw}resultTime> "2026-01-01T00:00:00Z"^^<http://www.w3.org/2001/XMLSchema#dateTime>'
    )
    assert installed.gateway.update(f"INSERT DATA {{ GRAPH <{latest}> {{ {bad} }} }}").status == 200
    try:
        for value in ("2.5", "3.5"):
            publish(sensor, "gateway/escape-check/temperature", value)
            wait_for(browser, f"return {TILE_VALUE} === '{value}'", "escape-check", "temperature", what=value)
        assert tile_value(browser, "bad%E0", "t%E0") == "1"  # shown raw, not dropped
        assert console_errors(browser) == []
    finally:  # the other tests' pages must not meet it
        assert installed.gateway.update(f"DELETE WHERE {{ GRAPH <{latest}> {{ <{node}> ?p ?o }} }}").status == 200


def test_a_unit_named_as_a_member_of_every_object_is_shown_as_its_name(
    browser: Any, installed: InstalledGateway
) -> None:
    """The unit's symbol was looked up in a plain object: a unit IRI ending in "constructor" showed
    "function Object() { [native code] }" in its tile and chart label, one ending in "__proto__"
    "[object Object]"."""
    latest = "http://w3id.org/sepa-gateway/graph/latest"
    gw = "http://w3id.org/sepa-gateway/ns#"
    time_ = '"2026-01-01T00:00:00Z"^^<http://www.w3.org/2001/XMLSchema#dateTime>'
    units = {"constructor": "urn:dash:latest:ctor", "__proto__": "urn:dash:latest:proto", "DEG_C": "urn:dash:latest:c"}
    nodes = " ".join(
        f"<{node}> <{gw}sensor> <urn:s:unit-check> ; <{gw}property> <urn:p:{unit}> ; <{gw}unit> <urn:u:{unit}> ; "
        f"<{gw}value> 1.0 ; <{gw}resultTime> {time_} ."
        for unit, node in units.items()
    )
    unit_of = TILE_VALUE.replace("querySelector('.value')", "querySelector('.unit')")
    assert installed.gateway.update(f"INSERT DATA {{ GRAPH <{latest}> {{ {nodes} }} }}").status == 200
    try:
        for unit, shown in (("constructor", "constructor"), ("__proto__", "__proto__"), ("DEG_C", "°C")):
            wait_for(browser, f"return {TILE_VALUE} !== null", "unit-check", unit, what=f"the tile of {unit}")
            assert browser.execute_script(f"return {unit_of};", "unit-check", unit) == shown
    finally:  # the other tests' pages must not meet them
        for node in units.values():
            assert installed.gateway.update(f"DELETE WHERE {{ GRAPH <{latest}> {{ <{node}> ?p ?o }} }}").status == 200


def console_run(browser: Any, sparql: str, button: str, *, delay: str = "") -> None:
    """Type `sparql` in the console and press `button` (run-query, run-update, run-subscribe)."""
    open_panel(browser, "console-panel")
    box = browser.find_element("id", "sparql")
    box.clear()
    box.send_keys(sparql)
    if delay:
        browser.find_element("id", "update-delay").send_keys(delay)
    browser.find_element("id", button).click()


def open_panel(browser: Any, panel: str) -> None:
    if not browser.find_element("id", panel).get_attribute("open"):
        browser.find_element("css selector", f"#{panel} > summary").click()


def test_a_delayed_update_from_the_console_is_listed_and_cancelled(browser: Any, installed: InstalledGateway) -> None:
    subject = f"urn:dash:{uuid.uuid4().hex[:8]}"
    console_run(browser, f"INSERT DATA {{ <{subject}> <urn:dash:p> 1 }}", "run-update", delay="PT1H")
    scheduled = wait_for(
        browser,
        "const p = document.querySelector('#console-result .update-result');"
        "return p && p.textContent.startsWith('scheduled') && p.textContent",
        what="the scheduled reply",
    )
    pending = installed.gateway.request("GET", "/scheduled").json()["scheduled"]
    (entry,) = [item for item in pending if subject in item["update"]]
    assert entry["id"] in scheduled
    browser.find_element("id", "update-delay").clear()
    open_panel(browser, "scheduled-panel")
    browser.find_element("id", "scheduled-refresh").click()
    row = f"document.querySelector('#scheduled tr[data-id=\"{entry['id']}\"]')"
    wait_for(browser, f"return {row} !== null", what="the delayed update in the list")
    browser.execute_script(f"{row}.querySelector('button').click()")
    wait_for(browser, f"return {row} === null", what="the delayed update gone from the list")
    pending = installed.gateway.request("GET", "/scheduled").json()["scheduled"]
    assert [item for item in pending if subject in item["update"]] == []


SCHEDULE_MANY = """
const [count, subject, done] = arguments;
const token = JSON.parse(sessionStorage.getItem('sepa-dashboard-token')).value;
const send = (index) => fetch('/secure/update?delay=PT1H', {
  method: 'POST',
  headers: { Authorization: 'Bearer ' + token, 'Content-Type': 'application/sparql-update' },
  body: `INSERT DATA { <${subject}> <urn:dash:n> ${index} }`,
}).then((reply) => reply.status);
Promise.all(Array.from({ length: count }, (_, index) => send(index))).then(done, (error) => done(String(error)));
"""


def test_a_long_list_of_delayed_updates_comes_a_page_at_a_time(browser: Any, installed: InstalledGateway) -> None:
    """The list pages through GET /secure/scheduled (200 a page, then a "More" button) instead of
    showing the broker's first page of 1,000 as if it were all."""
    subject = f"urn:dash:{uuid.uuid4().hex[:8]}"
    browser.set_script_timeout(60)
    statuses = browser.execute_async_script(SCHEDULE_MANY, 201, subject)
    assert statuses == [202] * 201, statuses  # accepted, due in an hour
    try:
        open_panel(browser, "scheduled-panel")
        browser.find_element("id", "scheduled-refresh").click()
        count = "return document.querySelectorAll('#scheduled tbody tr').length"
        wait_for(browser, f"{count} === 200 && document.querySelector('#scheduled button.more') !== null")
        browser.execute_script("document.querySelector('#scheduled button.more').click()")
        wait_for(browser, f"{count} === 201 && document.querySelector('#scheduled button.more') === null")
        shown = browser.execute_script(
            "return [...document.querySelectorAll('#scheduled tbody tr')].map(r => r.dataset.id)"
        )
        assert len(set(shown)) == 201  # every one once
    finally:
        for item in installed.gateway.request("GET", "/scheduled").json()["scheduled"]:
            if subject in item["update"]:
                installed.gateway.request("DELETE", f"/scheduled/{item['id']}")


def test_a_mapping_added_in_the_page_maps_the_next_readings(
    browser: Any, installed: InstalledGateway, sensor: mqtt.Client
) -> None:
    open_panel(browser, "mappings-panel")
    form = browser.find_element("id", "mapping-form")
    for name, value in {
        "id": "kilns",
        "topic": "plant/{kiln}/heat",
        "sensor": "urn:example:kiln/{kiln}",
        "property": "temperature",
        "unit": "degC",
    }.items():
        form.find_element("name", name).send_keys(value)
    form.find_element("css selector", "button[type=submit]").click()
    wait_for(
        browser,
        "return [...document.querySelectorAll('#mappings td')].some((td) => td.textContent === 'plant/{kiln}/heat')",
        what="the new mapping in the list",
    )
    # one row for the mapping, its optional fields (other branches of the subscription's UNION) in it
    cells = wait_for(
        browser,
        "const row = [...document.querySelectorAll('#mappings tr')].find((tr) => "
        "[...tr.cells].some((td) => td.textContent === 'plant/{kiln}/heat'));"
        "const cells = [...row.cells].map((td) => td.textContent);"
        "return cells.includes('degC') && cells.includes('temperature') ? cells : null",
        what="the mapping's unit and property in its row",
    )
    assert cells == ["kilns", "plant/{kiln}/heat", "number", "urn:example:kiln/{kiln}", "temperature", "degC"]
    publish(sensor, "plant/kiln7/heat", "480")
    wait_for(browser, "return [...document.querySelectorAll('.tile .sensor')].some((s) => s.textContent === 'kiln7')")
    assert tile_value(browser, "kiln7", "temperature") == "480"


def add_mapping(browser: Any, fields: dict[str, str]) -> None:
    form = browser.find_element("id", "mapping-form")
    for name, value in fields.items():
        form.find_element("name", name).clear()
        form.find_element("name", name).send_keys(value)
    form.find_element("css selector", "button[type=submit]").click()


def test_a_mapping_id_that_exists_is_refused_in_the_form_and_the_mapping_keeps_working(
    browser: Any, installed: InstalledGateway, sensor: mqtt.Client
) -> None:
    """The second add of an id gave its node two gw:topicFilter values: the MQTT adapter dropped the
    mapping (a log line only), readings on its topic stopped being stored, the page said nothing
    (the tester's t10_mapping.py)."""
    open_panel(browser, "mappings-panel")
    first = {
        "id": "ovens",
        "topic": "plant/{oven}/oven",
        "sensor": "urn:example:oven/{oven}",
        "property": "temperature",
        "unit": "degC",
    }
    add_mapping(browser, first)
    wait_for(
        browser,
        "return [...document.querySelectorAll('#mappings td')].some((td) => td.textContent === 'plant/{oven}/oven')",
        what="the new mapping in the list",
    )
    publish(sensor, "plant/oven1/oven", "200")
    wait_for(browser, f"return {TILE_VALUE} === '200'", "oven1", "temperature", what="the first reading's tile")
    assert browser.execute_script("return document.getElementById('mappings-error').textContent") == ""

    add_mapping(browser, {**first, "topic": "elsewhere/{oven}"})
    error = wait_for(
        browser, "return document.getElementById('mappings-error').textContent", what="an error in the form"
    )
    assert "ovens" in error and "exists already" in error
    node = "urn:sepa-gateway:mapping:ovens"
    topics = installed.gateway.select(f"SELECT ?t WHERE {{ GRAPH ?g {{ <{node}> <{GW}topicFilter> ?t }} }}")
    assert [row["t"] for row in topics] == ["plant/{oven}/oven"]
    publish(sensor, "plant/oven1/oven", "201")  # the mapping still maps
    wait_for(browser, f"return {TILE_VALUE} === '201'", "oven1", "temperature", what="the next reading's tile")
    # the refused form is kept as it was typed: emptied for the next test
    browser.execute_script("document.getElementById('mapping-form').reset()")


def test_what_a_form_takes_is_written_as_a_literal_never_as_sparql(browser: Any, installed: InstalledGateway) -> None:
    """A topic filter that tries to close the literal and run its own update stays a string."""
    canary = f"urn:dash:{uuid.uuid4().hex[:8]}"
    assert installed.gateway.update(f"INSERT DATA {{ <{canary}> <urn:dash:p> 1 }}").status == 200
    hostile = 'x" } } ; DROP ALL ; INSERT DATA { GRAPH <urn:g> { <urn:a> <urn:b> "'
    open_panel(browser, "mappings-panel")
    form = browser.find_element("id", "mapping-form")
    form.find_element("name", "id").send_keys("hostile")
    form.find_element("name", "topic").send_keys(hostile)
    form.find_element("css selector", "button[type=submit]").click()
    wait_for(
        browser,
        "return [...document.querySelectorAll('#mappings td')].some((td) => td.textContent === arguments[0])",
        hostile,
        what="the hostile filter listed as text",
    )
    assert installed.gateway.ask(f"ASK {{ <{canary}> <urn:dash:p> 1 }}")  # nothing was dropped
    rows = installed.gateway.select(
        'SELECT ?t WHERE { GRAPH ?g { ?m <http://w3id.org/sepa-gateway/ns#mappingId> "hostile" ; '
        "<http://w3id.org/sepa-gateway/ns#topicFilter> ?t } }"
    )
    assert rows == [{"t": hostile}]


def test_a_construct_in_the_console_shows_turtle(browser: Any, installed: InstalledGateway) -> None:
    console_run(browser, "CONSTRUCT { <urn:dash:c> <urn:dash:p> 7 } WHERE {}", "run-query")
    text = wait_for(browser, "return document.querySelector('#console-result pre')?.textContent", what="Turtle")
    assert "<urn:dash:c>" in text and "7" in text


def test_the_gateway_panel_shows_subscriptions_and_rates(browser: Any) -> None:
    open_panel(browser, "gateway-panel")
    figures = wait_for(
        browser,
        "const dts = [...document.querySelectorAll('#stats dt')].map((d) => d.textContent);"
        "return dts.includes('subscriptions') && dts.includes('mqtt_readings') && dts",
        what="the figures",
    )
    assert "ws_connections" in figures and "updates_total" in figures
    wait_for(browser, "return document.querySelector('#metrics-chart canvas') !== null", what="the rates chart")
    assert browser.find_element("id", "metrics-error").text == ""


SPU_ROW = """
const rows = [...document.querySelectorAll('#spus tr')].map((r) => [...r.cells].map((c) => c.textContent));
return rows.find((cells) => cells[5] && cells[5].includes(arguments[0]) && cells[2] === arguments[1]) || null;
"""


def test_the_gateway_panel_lists_the_spus_with_their_queries_and_figures(
    browser: Any, installed: InstalledGateway
) -> None:
    subject = f"urn:dash:{uuid.uuid4().hex[:8]}"
    console_run(browser, f"SELECT ?o WHERE {{ <{subject}> <urn:dash:spu> ?o }}", "run-subscribe")
    wait_for(browser, CONSOLE_ROWS, subject, "table.current", what="the console subscription")
    assert installed.gateway.update(f"INSERT DATA {{ <{subject}> <urn:dash:spu> 1 }}").status == 200
    open_panel(browser, "gateway-panel")
    # notification 0, then the insertion's; one solution held; held by the page's client; refreshed with the polls
    row = wait_for(browser, SPU_ROW, subject, "2", what="the console subscription's SPU")
    assert row == ["incremental", "1", "2", "1", "dashboard", f"SELECT ?o WHERE {{ <{subject}> <urn:dash:spu> ?o }}"]
    summary = browser.find_element("id", "spus-summary").text
    assert re.fullmatch(r"\d+ SPUs, \d+ subscriptions", summary), summary
    assert browser.find_element("id", "metrics-error").text == ""


def test_an_actuator_control_changes_the_store(browser: Any, installed: InstalledGateway) -> None:
    assert installed.gateway.update(lamp_update("Lamp7", "OFF")).status == 200
    line = f"document.querySelector('.actuator[data-target=\"{SL}Lamp7\"]')"
    wait_for(browser, f"return {line}?.dataset.state === '{SL}OFF'", what="the lamp's control")
    browser.execute_script(f"{line}.querySelector('button[data-state=\"{SL}ON\"]').click()")
    deadline = time.monotonic() + 10
    while lamp_state(installed.gateway, "Lamp7") != "ON":
        assert time.monotonic() < deadline, "the lamp is still not ON in the store"
        time.sleep(0.05)
    wait_for(browser, f"return {line}?.dataset.state === '{SL}ON'", what="the control to show ON")


def test_a_client_without_write_rights_sees_no_control(
    installed: InstalledGateway, viewer: Credentials, sensor: mqtt.Client
) -> None:
    assert installed.gateway.update(lamp_update("Lamp8", "OFF")).status == 200
    with chromium(flags=trusting(installed.certificate)) as driver:
        log_in(driver, installed.gateway.https_url, viewer)
        publish(sensor, "gateway/viewer-check/temperature", "5.5")
        wait_for(driver, "return document.querySelectorAll('.tile').length > 0", what="the viewer's tiles")
        assert driver.find_element("id", "who").text == "client viewer"
        time.sleep(1.0)  # the actuators' description is fetched and filtered after the rights came
        assert driver.execute_script("return document.getElementById('actuators-panel').hidden") is True
        assert driver.find_elements("css selector", ".actuator-control") == []
        for control in ("mapping-form", "coap-form", "run-update", "update-delay"):  # 403 if used: not shown
            assert driver.execute_script(f"return document.getElementById('{control}').hidden") is True, control
        assert console_errors(driver) == []


def test_a_client_that_may_write_sees_the_forms(browser: Any) -> None:
    for control in ("mapping-form", "coap-form", "run-update", "update-delay"):
        assert browser.execute_script(f"return document.getElementById('{control}').hidden") is False, control


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", header[16:24])


@pytest.mark.parametrize(("name", "width", "height"), [("phone", 390, 844), ("desktop", 1280, 900)])
def test_screenshots_at_phone_and_desktop_widths(
    installed: InstalledGateway,
    writer: Credentials,
    sensor: mqtt.Client,
    artifacts: Any,
    name: str,
    width: int,
    height: int,
) -> None:
    for index in range(6):
        publish(sensor, f"gateway/room-{index}/temperature", f"{20 + index}.5")
    assert installed.gateway.update(lamp_update("Lamp1", "ON")).status == 200
    with chromium(width, height, flags=trusting(installed.certificate)) as driver:
        if name == "phone":  # a headless window is 500 px wide at least: the phone's screen is emulated
            metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": True}
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        log_in(driver, installed.gateway.https_url, writer)
        assert driver.execute_script("return window.innerWidth") == width
        wait_for(driver, "return document.querySelectorAll('.tile').length >= 6", what="the tiles")
        driver.execute_script("document.querySelector('.tile').click()")
        wait_for(driver, "return document.querySelector('#chart canvas') !== null", what="the chart")
        time.sleep(0.3)
        overflow = driver.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"the page is {overflow} px wider than a {width} px screen"
        path = artifacts.path(f"dashboard-{name}-{width}px.png")
        assert driver.save_screenshot(str(path))
        inner = driver.execute_script("return window.innerWidth")
        assert png_size(path)[0] == inner
        print(f"screenshot: {path}")
