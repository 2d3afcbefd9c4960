"""What a large or hostile amount of data does to the operator's view, in real Chromium on the
plain port (no login): the page must stay usable, and say so when the gateway ends a view."""

from __future__ import annotations

import threading
import time
from typing import Any

from gateway.appliance.config import Config
from gateway.observations.vocabulary import GRAPH_LATEST
from tests.gateway.dashboard.dashboard_support import (
    CONSOLE_ROWS,
    SL,
    SMART_LIGHTING,
    wait_for,
    wait_until_live,
)
from tests.support.browser import chromium
from tools.dashboard_bench.cpu import renderer_main_thread_cpu_seconds, renderer_main_thread_running

GW = "http://w3id.org/sepa-gateway/ns#"
TIME = '"2026-12-06T12:00:00Z"^^<http://www.w3.org/2001/XMLSchema#dateTime>'
# the CPU seconds of the page's main thread while it shows MANY_TILES new tiles at once
MANY_TILES = 20_000
MANY_TILES_CPU_S = 12.0  # between 8.8 (loaded, this page) and 17.1 (unloaded, bisection back)
# a console query's rows, and the longest task of the page's main thread while it shows them
LARGE_RESULT = 90_000
LARGE_RESULT_TASK_MS = 200
# how long a console query of LARGE_RESULT rows is given to come back: 2.4 s unloaded
SLOW_QUERY_S = 20
TILE_COUNT = "document.getElementById('tiles').childElementCount"
# drawn once the tiles' subscription, and the lamps', sent their first notification (made, not just sent)
SENSOR_COUNT = "document.getElementById('sensor-count').textContent"
ACTUATORS = "document.getElementById('actuators').textContent"
# how long a view is given to be made or ended: ~0.3 s at load 8-10; time is not the point there
VIEW_S = 60
LONG_TASKS = (
    "window.longTasks = [];"
    "new PerformanceObserver((list) => {"
    " for (const entry of list.getEntries()) window.longTasks.push(entry.duration); })"
    ".observe({ type: 'longtask' });"
)


def latest_nodes(count: int) -> str:
    """One small update that writes `count` sensors into the latest view (a product of two VALUES):
    one notification of the tiles' subscription brings them all."""
    tens = " ".join(str(index) for index in range(100))
    hundreds = " ".join(str(index) for index in range(count // 100))
    return f"""PREFIX gw: <{GW}> INSERT {{ GRAPH <{GRAPH_LATEST}> {{
      ?node gw:sensor ?sensor ; gw:property <urn:p:temperature> ; gw:value ?value ; gw:resultTime {TIME} }} }}
    WHERE {{ VALUES ?high {{ {hundreds} }} VALUES ?low {{ {tens} }}
      BIND(?high * 100 + ?low AS ?value)
      BIND(IRI(CONCAT("urn:node:", STR(?value))) AS ?node)
      BIND(IRI(CONCAT("urn:sensor:", STR(?value))) AS ?sensor) }}"""


def test_twenty_thousand_new_tiles_do_not_freeze_the_page(in_process_gateway) -> None:
    """Each new tile found its place by bisection of the container's children, and an index into
    them after an insertion walks the list again: 20,000 sensors arriving in one notification held
    the main thread 17.1 s in one task (a publisher allowed a templated topic makes that many).
    Now they are merged in one pass and off-screen tiles are not laid out: 2.8-2.9 s.

    The bar is on the CPU seconds of the page's main thread (its renderer's, from /proc) over the
    phase, not on the longest task's wall-clock duration, which load stretches: what is measured is
    the page's own work (the gateway's is in no task of the page), but at load 6-12 on 2 shared
    cores the longest task lasted 5.3-11.4 s (the 5 s bar failed) for 5.5-8.8 CPU seconds of that
    thread in the whole phase; with the bisection back and tiles laid out off the screen it was
    51.1 CPU seconds (longest task 89.5 s) and 17.1 s unloaded, and this test fails at 12 CPU
    seconds (2026-12-07, `pytest tests/gateway/dashboard/test_dashboard_volume.py -k twenty -s`,
    alternating the two trees)."""
    config = Config()
    # the gateway's part, not the page's: at load 12 the update of 20,000 sensors ran past the
    # default 10 s limit and was refused (503)
    config.engine.time_limit_s = 120
    gateway = in_process_gateway(config)
    with chromium() as driver:
        driver.get(gateway.http_url + "/")
        wait_until_live(driver)
        driver.execute_script(LONG_TASKS)
        before = renderer_main_thread_cpu_seconds(driver.service.process.pid)
        assert gateway.update(latest_nodes(MANY_TILES)).status == 200
        cpu = shown_within_cpu(driver, MANY_TILES, before)
        order = driver.execute_script(
            "return [...document.querySelectorAll('#tiles .tile .sensor')].slice(0, 3).map((s) => s.textContent)"
        )
        assert order == ["0", "1", "10"]  # in sensor order (as text)
        longest = max(driver.execute_script("return window.longTasks"), default=0)
        print(f"page main-thread cpu {cpu:.2f} s, longest task {longest:.0f} ms")


def shown_within_cpu(driver: Any, tiles: int, before: float) -> float:
    """Wait until the page shows `tiles` tiles, its main thread's CPU seconds since `before` held
    under MANY_TILES_CPU_S meanwhile: those seconds. The page is asked only while that thread is
    idle (sleeping through 10 looks over 0.2 s): asked during a long task, a script waits for its
    end, and a page held 90 s (the bisection back, at load 6-14) failed on chromedriver's or
    selenium's timeouts, not on the bar."""
    root = driver.service.process.pid
    deadline = time.monotonic() + 300
    while True:
        running = False
        for _ in range(10):
            running = running or renderer_main_thread_running(root)
            time.sleep(0.02)
        cpu = renderer_main_thread_cpu_seconds(root) - before
        assert cpu < MANY_TILES_CPU_S, f"the page's main thread worked {cpu:.1f} s, still showing"
        if not running and driver.execute_script(f"return {TILE_COUNT}") == tiles:
            return cpu
        assert time.monotonic() < deadline, "timed out waiting for every tile"


def test_a_sensors_view_the_gateway_ends_says_so(in_process_gateway) -> None:
    """Past `[websocket] max_subscription_rows` (100,000: about 25,000 sensor values) the gateway
    ends the tiles' subscription with a 413 error frame. The page dropped it: every tile froze at
    its last value with nothing to say why, and after a reload the panel was empty, silently (a
    publisher allowed a templated topic did it to every operator's page with 26,000 sensors). The
    actuators' lists the same.

    Each view's first notification is waited for before the rows are written, so that it is the
    ending of a view that is tested: "live" is the socket open, the subscriptions sent, not made.
    Written in between (the probe saw 0 rows), the tiles' subscription was made with 80 rows, past
    the limit, and never ended: 1 run in 10 failed here (2026-12-07, idle); the gateway now refuses
    it (tests/broker/core/test_subscription_growth.py, a write between the probe and the subscribe)."""
    config = Config()
    config.websocket.max_subscription_rows = 50  # 20 sensors: 80 rows
    gateway = in_process_gateway(config)
    rows = " ".join(
        f"<urn:node:{index}> gw:sensor <urn:sensor:{index}> ; gw:property <urn:p:t> ; gw:value {index} ;"
        f" gw:resultTime {TIME} ."
        for index in range(20)
    )
    error = "return document.getElementById('sensors-error').textContent"
    with chromium() as driver:
        driver.get(gateway.http_url + "/")
        wait_until_live(driver)
        tiles_made = f"return {SENSOR_COUNT} === '0 sensors, 0 values'"
        wait_for(driver, tiles_made, timeout=VIEW_S, what="the tiles' first notification")
        lamps_made = f"return {ACTUATORS}.includes('none yet')"
        wait_for(driver, lamps_made, timeout=VIEW_S, what="the lamps' first notification")
        assert driver.execute_script(error) == ""
        assert gateway.update(f"PREFIX gw: <{GW}> INSERT DATA {{ GRAPH <{GRAPH_LATEST}> {{ {rows} }} }}").status == 200
        shown = wait_for(driver, error, timeout=VIEW_S, what="the sensors' error")
        assert "no longer updated" in shown and "max_subscription_rows" in shown
        lamps = " ".join(f"sl:Lamp{index} a sl:Lamp ; sl:status sl:OFF ." for index in range(60))  # a row each
        assert (
            gateway.update(f"PREFIX sl: <{SL}> INSERT DATA {{ GRAPH <{SMART_LIGHTING}> {{ {lamps} }} }}").status == 200
        )
        lamps_error = "return document.getElementById('actuators-error').textContent"
        shown = wait_for(driver, lamps_error, timeout=VIEW_S, what="the lamps' error")
        assert "no longer updated" in shown and "max_subscription_rows" in shown
        driver.refresh()  # subscribed again: refused at once
        wait_until_live(driver)
        shown = wait_for(driver, error, timeout=VIEW_S, what="the sensors' error after a reload")
        assert "max_subscription_rows" in shown


def test_the_tiles_are_asked_for_again_while_the_gateway_is_too_busy_for_them(in_process_gateway) -> None:
    """After 10 s of 1,000 readings/s on a loaded machine the query workers were behind by more
    than their time limit: the tiles' subscription was refused with a 503 ("no query worker became
    free within 10 s; retry later") and the panel stayed empty until a reload (`bench dashboard`
    failed there). Here the only query worker counts 70^4 rows for seconds while the page
    subscribes, with a 1 s limit: the page says so, asks again, and shows the tile."""
    config = Config()
    config.engine.query_workers = 1
    config.engine.time_limit_s = 1
    gateway = in_process_gateway(config)
    slow = " ".join(f"<urn:x{n}> <urn:slow> {n} ." for n in range(70))
    tile = f"<urn:node:1> gw:sensor <urn:sensor:1> ; gw:property <urn:p:t> ; gw:value 21 ; gw:resultTime {TIME} ."
    update = f"PREFIX gw: <{GW}> INSERT DATA {{ {slow} GRAPH <{GRAPH_LATEST}> {{ {tile} }} }}"
    assert gateway.update(update).status == 200
    count = "SELECT (COUNT(*) AS ?n) WHERE { " + " ".join(f"?s{i} <urn:slow> ?o{i} ." for i in range(4)) + " }"
    workers = gateway.gateway.engine.workers
    holder = threading.Thread(target=lambda: workers.run("materialized", count, time_limit_s=120))
    error = "return document.getElementById('sensors-error').textContent"
    with chromium() as driver:
        holder.start()
        time.sleep(0.3)  # the count is in the worker
        driver.get(gateway.http_url + "/")
        shown = wait_for(driver, error, timeout=30, what="the sensors' error")
        assert "no query worker became free" in shown and "asking again" in shown
        assert holder.is_alive(), "the worker was free again before the page was refused"
        holder.join(120)
        wait_for(driver, f"return {TILE_COUNT} === 1", timeout=60, what="the tile")
        wait_for(driver, f"{error} === ''", what="the error gone")


def insert_large_result(gateway: Any) -> None:
    """LARGE_RESULT rows of `?s <urn:p> ?o` (300 objects for each of 300 subjects), in updates of
    3,000 rows: a VALUES product each, as one INSERT DATA of them all would be a 6 MB request."""
    columns = " ".join(str(index) for index in range(300))
    for first in range(0, LARGE_RESULT // 300, 10):
        subjects = " ".join(str(index) for index in range(first, first + 10))
        update = f"""INSERT {{ ?s <urn:p> ?o }} WHERE {{ VALUES ?a {{ {subjects} }} VALUES ?b {{ {columns} }}
          BIND(IRI(CONCAT("urn:s:", STR(?a))) AS ?s) BIND(CONCAT("value ", STR(?a * 300 + ?b)) AS ?o) }}"""
        assert gateway.update(update).status == 200


def longest_task_ms(driver: Any) -> float:
    """The longest task of the page's main thread since LONG_TASKS was run, once the last is observed."""
    time.sleep(0.5)
    return max(driver.execute_script("return window.longTasks"), default=0)


def test_a_large_query_result_does_not_hold_the_page(in_process_gateway) -> None:
    """A 90,000-row SELECT in the console is ~12 MB of SPARQL JSON: parsed on the page's main thread
    it held it 663 and 234 ms (load average 16), the tiles and chart frozen meanwhile. Now it is
    fetched and parsed in a worker and only the rows drawn come back: no task past LARGE_RESULT_TASK_MS."""
    gateway = in_process_gateway(Config())
    insert_large_result(gateway)
    with chromium() as driver:
        driver.get(gateway.http_url + "/")
        wait_until_live(driver)
        driver.find_element("css selector", "#console-panel > summary").click()
        driver.execute_script(
            "document.getElementById('sparql').value = arguments[0]", "SELECT ?s ?o WHERE { ?s <urn:p> ?o }"
        )
        driver.execute_script(LONG_TASKS)
        driver.find_element("id", "run-query").click()
        note = "return document.querySelector('#console-result .rows-left-out')?.textContent"
        assert wait_for(driver, note, timeout=60, what="the result") == f"{LARGE_RESULT} rows: the first 500 are shown"
        assert len(driver.find_elements("css selector", "#console-result table tbody tr")) == 500
        longest = longest_task_ms(driver)
        assert longest < LARGE_RESULT_TASK_MS, f"the page's main thread was held {longest:.0f} ms in one task"


def test_a_large_subscription_does_not_hold_the_page(in_process_gateway) -> None:
    """A console subscription of 90,000 rows: its first notification is ~12 MB of JSON, and received
    and parsed on the page's main thread it held it 1,316 ms in one task (2026-12-07, load 7; 436-1,428
    ms before). Now the subscription's WebSocket is a worker's, which keeps its rows and sends the
    page only what is drawn: no task past LARGE_RESULT_TASK_MS (110 ms at load 12), and the changes of
    later notifications still shown."""
    gateway = in_process_gateway(Config())
    insert_large_result(gateway)
    with chromium() as driver:
        driver.get(gateway.http_url + "/")
        wait_until_live(driver)
        driver.find_element("css selector", "#console-panel > summary").click()
        longest = []
        for marker in ("# first", "# second"):
            sparql = f"SELECT ?s ?o WHERE {{ ?s <urn:p> ?o }} {marker}"
            driver.execute_script("document.getElementById('sparql').value = arguments[0]", sparql)
            driver.execute_script(LONG_TASKS)
            driver.find_element("id", "run-subscribe").click()
            note = f"const rows = (() => {{ {CONSOLE_ROWS} }})(); return rows && rows[0]"
            shown = wait_for(driver, note, marker, ".rows-left-out", timeout=60, what="the subscription's rows")
            assert shown == f"{LARGE_RESULT} rows: the first 500 are shown"
            assert len(driver.execute_script(CONSOLE_ROWS, marker, "table.current tbody tr")) == 500
            longest.append(longest_task_ms(driver))
        # the shorter of two subscriptions' longest tasks: one task stretched by a loaded machine
        # (397 ms once, load ~10) fails neither, the main thread's parse fails both (2026-12-07, idle:
        # [503, 487] ms with the page before b34e86f, [83, 69] now)
        assert min(longest) < LARGE_RESULT_TASK_MS, f"the page's main thread was held {longest} ms in one task"
        change = 'DELETE DATA { <urn:s:0> <urn:p> "value 0" } ; INSERT DATA { <urn:s:new> <urn:p> "new" }'
        assert gateway.update(change).status == 200
        added = wait_for(driver, CONSOLE_ROWS, "<urn:p>", "table.changes tr.row-added", what="the added row")
        assert added == ['<urn:s:new>"new"']
        assert driver.execute_script(CONSOLE_ROWS, "<urn:p>", "table.changes tr.row-removed") == ['<urn:s:0>"value 0"']
        counts = driver.execute_script(CONSOLE_ROWS, "<urn:p>", ".notification-counts")
        assert len(counts) == 1 and counts[0].endswith(": 1 added, 1 removed"), counts
        heading = f"Current rows ({LARGE_RESULT})"
        assert driver.execute_script(CONSOLE_ROWS, "<urn:p>", "h4") == [heading, "Changes, newest first"]


def test_a_slow_query_does_not_replace_the_result_of_the_query_run_after_it(in_process_gateway) -> None:
    """Each console query ran to its end in a worker of its own and drew its result when it came: a
    90,000-row SELECT, then an ASK run while it was still on its way, showed "true", then the
    SELECT's table (under the ASK's text), ~2.4 s after it was run. Now running a query ends the one
    before it, and only the last query or update run draws its reply."""
    gateway = in_process_gateway(Config())
    insert_large_result(gateway)
    sparql = "document.getElementById('sparql').value = arguments[0]"
    shown = "return document.getElementById('console-result').textContent"
    with chromium() as driver:
        driver.get(gateway.http_url + "/")
        wait_until_live(driver)
        driver.find_element("css selector", "#console-panel > summary").click()
        driver.execute_script(sparql, "SELECT ?s ?o WHERE { ?s <urn:p> ?o }")
        driver.find_element("id", "run-query").click()
        driver.execute_script(sparql, "ASK {}")
        driver.find_element("id", "run-query").click()
        assert wait_for(driver, shown, timeout=60, what="the ASK's result") == "true"
        time.sleep(SLOW_QUERY_S)  # the SELECT's table came within this (2.4 s unloaded), replacing "true"
        assert driver.execute_script(shown) == "true"
        assert driver.execute_script("return document.getElementById('console-error').textContent") == ""
