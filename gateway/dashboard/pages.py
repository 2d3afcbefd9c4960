"""Serving the dashboard: `/`, its files under `/dashboard/`, and `/dashboard/config.json`.

The pages are public static content on both ports (they hold no data); every data call of the page
goes to the gates' own routes, with a token on the HTTPS port. `config.json` tells the script which
port it was loaded from and where things are on it, so the same files serve both.

Every reply carries a strict Content-Security-Policy (scripts, styles and connections to this
origin only: no inline script, nothing from elsewhere; `connect-src 'self'` covers the WebSocket of
the same host and port), `X-Content-Type-Options: nosniff`, and `Cache-Control: no-cache` with an
ETag: a browser revalidates each file (a 304 on the LAN costs nothing) and never runs a stale
script after an upgrade of the gateway.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from aiohttp import hdrs, web

from broker.api import SECURE_PATHS, Gates
from gateway.dashboard.assets import Asset, asset, load_assets
from gateway.observations.vocabulary import GRAPH_LATEST, GRAPH_MAPPINGS, GRAPH_OBSERVATIONS

PREFIX = "/dashboard/"
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
# stale = no reading for STALE_PERIODS periods of the sensor (docs/dashboard.md)
STALE_PERIODS = 3


@dataclass(frozen=True)
class DashboardPaths:
    """Where the plain gates serve what the page uses (the configured paths of the HTTP port)."""

    query: str = "/query"
    update: str = "/update"
    scheduled: str = "/scheduled"
    subscribe: str = "/subscribe"
    metrics: str = "/metrics"
    spus: str = "/spus"


class Dashboard:
    """The dashboard's routes, added to the gates with :meth:`add_to`."""

    def __init__(self, paths: DashboardPaths | None = None, assets: dict[str, Asset] | None = None) -> None:
        self.assets = load_assets() if assets is None else assets
        paths = paths or DashboardPaths()
        graphs = {"latest": GRAPH_LATEST, "observations": GRAPH_OBSERVATIONS, "mappings": GRAPH_MAPPINGS}
        common = {"graphs": graphs, "stale_periods": STALE_PERIODS}
        # /health is the plain port's only (like /metrics there): the secure config has none
        plain = {
            "secure": False,
            **vars(paths),
            "rights": None,
            "token": None,
            "revoke": None,
            "health": "/health",
            **common,
        }
        secure = {"secure": True, **{key: SECURE_PATHS[key] for key in plain if key in SECURE_PATHS}, **common}
        secure["health"] = None
        self.configs = {
            False: asset(json.dumps(plain).encode(), "application/json"),
            True: asset(json.dumps(secure).encode(), "application/json"),
        }

    def add_to(self, gates: Gates) -> None:
        gates.add_page("/", self.index)
        gates.add_page(PREFIX + "config.json", self.config)
        for name in self.assets:
            if name != "index.html":
                gates.add_page(PREFIX + name, self.file)

    async def index(self, request: web.BaseRequest) -> web.StreamResponse:
        return reply(request, self.assets["index.html"])

    async def config(self, request: web.BaseRequest) -> web.StreamResponse:
        # the page also estimates the gateway's clock from this reply's Date (stale sensors are judged in its time)
        return reply(request, self.configs[request.secure])

    async def file(self, request: web.BaseRequest) -> web.StreamResponse:
        return reply(request, self.assets[request.path.removeprefix(PREFIX)])


def reply(request: web.BaseRequest, item: Asset) -> web.StreamResponse:
    """`item` with the security and cache headers: 304 when the browser has it, gzip when it takes it."""
    headers = {**SECURITY_HEADERS, hdrs.ETAG: item.etag, hdrs.VARY: "Accept-Encoding"}
    if item.etag in request.headers.get(hdrs.IF_NONE_MATCH, ""):
        return web.Response(status=304, headers=headers)
    headers[hdrs.CONTENT_TYPE] = item.content_type
    body = item.body
    if item.gzipped is not None and "gzip" in request.headers.get(hdrs.ACCEPT_ENCODING, ""):
        body = item.gzipped
        headers[hdrs.CONTENT_ENCODING] = "gzip"
    return web.Response(body=body, headers=headers)
