"""In real Chromium: a page from another origin that the user opens cannot change the store.

The attacker's page (served here from another port) submits a hidden form to /update, sends
`fetch` POSTs (a form body, a SPARQL body) and opens a WebSocket to subscribe. Against a gateway
that lists the page's origin in `cors_origins`, the same page does change the store: so the page
really sends what it should, and the refusal is the origin policy's doing.

And DNS rebinding: a page of attacker.example whose name comes to resolve to the gateway reads
/query same-origin; the plain gates refuse it by its Host (421). Without that check the page gets
200 and the whole store (seen while writing the test).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from aiohttp import web

from gateway.appliance.config import Config
from tests.support.browser import chromium
from tools.launcher import InProcessGateway, free_port

EX = "http://example.org/browser/"

PAGE = """<!doctype html>
<html><head><title>pending</title></head><body>
<form id="f" method="post" action="{gateway}/update" enctype="application/x-www-form-urlencoded">
  <input type="hidden" name="update" value="INSERT DATA {{ &lt;{ex}form&gt; &lt;{ex}p&gt; 1 }}">
</form>
<script>
const results = [];
async function attack() {{
  try {{
    await fetch("{gateway}/update", {{method: "POST", mode: "no-cors",
      headers: {{"Content-Type": "application/x-www-form-urlencoded"}},
      body: "update=" + encodeURIComponent("INSERT DATA {{ <{ex}fetch-form> <{ex}p> 1 }}")}});
    results.push("fetch-form sent");
  }} catch (e) {{ results.push("fetch-form failed"); }}
  try {{
    await fetch("{gateway}/update", {{method: "POST", mode: "no-cors",
      headers: {{"Content-Type": "text/plain"}}, body: "INSERT DATA {{ <{ex}fetch-text> <{ex}p> 1 }}"}});
    results.push("fetch-text sent");
  }} catch (e) {{ results.push("fetch-text failed"); }}
  await new Promise((resolve) => {{
    const ws = new WebSocket("{ws}/subscribe");
    ws.onopen = () => {{ results.push("ws open"); resolve(); }};
    ws.onerror = () => {{ results.push("ws refused"); resolve(); }};
  }});
  await fetch("/report", {{method: "POST", body: results.join(", ")}});
  document.getElementById("f").submit();
}}
attack();
</script></body></html>
"""


class AttackerSite:
    """An HTTP server on its own port (so another origin) serving the attacker's page."""

    def __init__(self, gateway: InProcessGateway) -> None:
        self.page = PAGE.format(gateway=gateway.http_url, ws=gateway.http_url.replace("http", "ws"), ex=EX)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner: web.AppRunner | None = None
        self.reports: list[str] = []
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> str:
        async def page(_request: web.Request) -> web.Response:
            return web.Response(text=self.page, content_type="text/html")

        async def report(request: web.Request) -> web.Response:
            self.reports.append(await request.text())
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/", page)
        app.router.add_post("/report", report)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    def close(self) -> None:
        assert self.runner is not None
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def written(gateway: InProcessGateway) -> set[str]:
    rows = gateway.select(f"SELECT ?s WHERE {{ ?s <{EX}p> 1 }}")
    return {row["s"].removeprefix(EX) for row in rows}


def visit(site: AttackerSite) -> str:
    """Open the page and return what its script reported (once its form went too)."""
    with chromium() as browser:
        browser.get(site.url)  # type: ignore[attr-defined]
        deadline = time.monotonic() + 15
        while not site.reports and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)  # the form submission navigates to the gateway
        return site.reports[-1] if site.reports else "no report"


@pytest.fixture
def attacked(in_process_gateway) -> Iterator[tuple[InProcessGateway, AttackerSite]]:
    gateway = in_process_gateway(Config())
    site = AttackerSite(gateway)
    yield gateway, site
    site.close()


def test_a_cross_origin_page_changes_nothing(attacked) -> None:
    gateway, site = attacked
    title = visit(site)
    assert "fetch-form sent" in title and "ws refused" in title, title
    assert written(gateway) == set()
    metrics = gateway.request("GET", "/metrics").body.decode()
    assert 'sepa_errors_total{error="forbidden",status="403"}' in metrics


def test_the_same_page_from_a_listed_origin_does_write(in_process_gateway) -> None:
    """The control: with the page's origin allowed, its requests go through."""
    probe = in_process_gateway(Config())
    site = AttackerSite(probe)
    try:
        config = Config()
        config.http.cors_origins = [site.url]
        gateway = in_process_gateway(config)
        site.page = PAGE.format(gateway=gateway.http_url, ws=gateway.http_url.replace("http", "ws"), ex=EX)
        title = visit(site)
        assert "ws open" in title, title
        assert written(gateway) == {"form", "fetch-form"}  # text/plain is not a SPARQL media type: 415
    finally:
        site.close()


# -- DNS rebinding ----------------------------------------------------------------------------

REBINDING_PAGE = """<!doctype html>
<html><head><title>attacker.example</title></head><body>
<script>
// called once attacker.example resolves to the gateway: same origin, so no Origin header, no CORS
window.steal = (done) => fetch("/query?query=" + encodeURIComponent("SELECT * WHERE { ?s ?p ?o }"))
  .then((reply) => reply.text().then((text) => done(reply.status + " " + text)))
  .catch((error) => done("failed " + error));
</script></body></html>
"""


def test_a_page_rebound_to_the_gateway_reads_nothing(start_gateway) -> None:
    """The attack as a browser sees it: the page of attacker.example:P is loaded from the attacker's
    server, then attacker.example:P is the gateway (here the name always resolves to 127.0.0.1,
    and the server behind port P changes, which is the same to the browser), and the page's
    script reads /query same-origin."""
    port = free_port()

    async def attackers_page(request: web.Request) -> web.Response:
        return web.Response(text=REBINDING_PAGE, content_type="text/html")

    page = web.Application()
    page.router.add_get("/", attackers_page)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = web.AppRunner(page)

    async def serve() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

    asyncio.run_coroutine_threadsafe(serve(), loop).result(10)
    with chromium(flags=("--host-resolver-rules=MAP attacker.example 127.0.0.1",)) as browser:
        try:
            browser.get(f"http://attacker.example:{port}/")
            assert browser.title == "attacker.example"
        finally:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
        gateway = start_gateway(http_port=port)  # "rebound": attacker.example:P is now the gateway
        assert gateway.update(f"INSERT DATA {{ <{EX}secret> <{EX}p> 'the store' }}").status == 200
        stolen = browser.execute_async_script("window.steal(arguments[arguments.length - 1])")
    assert stolen.startswith("421 ") and "misdirected_request" in stolen, stolen
    assert "secret" not in stolen
    assert gateway.metric('sepa_errors_total{error="misdirected_request",status="421"}') >= 1
