"""The dashboard: a static page on the gateway's own HTTP and HTTPS ports (`/`).

Plain HTML, ES modules and CSS in `static/` (no build step, no CDN: it works on a LAN without the
internet), with uPlot vendored in `static/vendor/uplot/` beside its licence. The page talks to the
gates like any other client (docs/dashboard.md): this package only serves files.
"""

from gateway.dashboard.pages import Dashboard, DashboardPaths

__all__ = ["Dashboard", "DashboardPaths"]
