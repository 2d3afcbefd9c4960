"""Driving the dashboard in Chromium: log in through its form, wait for what the page shows."""

from __future__ import annotations

import time
from typing import Any

from tools.dashboard_bench.installed import Credentials

SMART_LIGHTING = "http://sepa-gateway.example/smart-lighting"
SL = SMART_LIGHTING + "#"


def wait_for(browser: Any, script: str, *args: Any, timeout: float = 10.0, what: str = "") -> Any:
    """Run `script` (a function body returning a value) until its value is truthy; that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = browser.execute_script(script, *args)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or script}")
        time.sleep(0.02)


def log_in(browser: Any, url: str, credentials: Credentials) -> None:
    """Open the dashboard, log in with the form, and wait until its WebSocket is live."""
    browser.get(url + "/")
    wait_for(browser, "return !document.getElementById('login').hidden", what="the login form")
    browser.find_element("id", "client-id").send_keys(credentials.client_id)
    browser.find_element("id", "client-secret").send_keys(credentials.client_secret)
    browser.find_element("id", "login-button").click()
    wait_until_live(browser)


def wait_until_live(browser: Any) -> None:
    wait_for(
        browser,
        "return !document.getElementById('main').hidden && document.getElementById('status').textContent === 'live'",
        what="the dashboard to be live",
    )


# the value a tile shows (null: no such tile), as an expression: arguments[0] names the sensor,
# arguments[1] the property
TILE_VALUE = (
    "(() => { const tile = [...document.querySelectorAll('.tile')].find((t) =>"
    " t.querySelector('.sensor').textContent === arguments[0]"
    " && t.querySelector('.property').textContent === arguments[1]);"
    " return tile ? tile.querySelector('.value').textContent : null; })()"
)
SHOWN_ROWS = 500  # gateway/dashboard/static/console.js: the rows a console table draws


def tile_value(browser: Any, sensor: str, prop: str) -> str | None:
    return browser.execute_script(f"return {TILE_VALUE};", sensor, prop)


def lamp_update(lamp: str, state: str) -> str:
    return (
        f"PREFIX sl: <{SL}> DELETE WHERE {{ GRAPH <{SMART_LIGHTING}> {{ sl:{lamp} ?p ?o }} }} ; "
        f"INSERT DATA {{ GRAPH <{SMART_LIGHTING}> {{ sl:{lamp} a sl:Lamp ; sl:status sl:{state} }} }}"
    )


def lamp_state(gateway: Any, lamp: str) -> str | None:
    rows = gateway.select(f"SELECT ?s WHERE {{ GRAPH <{SMART_LIGHTING}> {{ <{SL}{lamp}> <{SL}status> ?s }} }}")
    return rows[0]["s"].removeprefix(SL) if len(rows) == 1 else None


# the texts of one console subscription's rows: arguments[0] names it, arguments[1] selects the rows
CONSOLE_ROWS = (
    "const sub = [...document.querySelectorAll('.console-subscription')]"
    ".find((s) => s.querySelector('code')?.textContent.includes(arguments[0]));"
    "return sub ? [...sub.querySelectorAll(arguments[1])].map((r) => r.textContent) : null;"
)
