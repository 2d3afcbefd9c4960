"""Run the landing endpoint until SIGTERM or SIGINT, then finish in-flight uploads and stop.

Why a runner of our own rather than ``web.run_app``: start-up failures (port in use, unreadable
certificate, landing directory that cannot be created) must surface as :class:`StartupError` for a
one-line message and exit code 2, and the listening address is logged once, as a lifecycle event.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from cloud.guards import GuardedSite
from cloud.landing import LANDING, landing_app
from cloud.settings import LandingSettings, SettingsError

log = logging.getLogger("cloud.server")

SHUTDOWN_SECONDS = 30.0


class StartupError(RuntimeError):
    """The endpoint cannot start; the message is meant for one line on stderr."""


async def serve(settings: LandingSettings, stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set (by SIGTERM/SIGINT when not given)."""
    try:
        app = landing_app(settings)
        ssl_context = settings.ssl_context()
    except SettingsError as error:
        raise StartupError(str(error)) from error
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_SECONDS)
    try:
        try:
            await runner.setup()
        except OSError as error:
            raise StartupError(f"cannot prepare the landing directory {settings.landing_dir}: {error}") from error
        site = GuardedSite(runner, settings.host, settings.port, guard=app[LANDING].guard, ssl_context=ssl_context)
        try:
            await site.start()
        except OSError as error:
            reason = error.strerror or error
            raise StartupError(f"cannot listen on {settings.host}:{settings.port}: {reason}") from error
        if stop is None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
        scheme = "https" if ssl_context else "http"
        log.info("landing endpoint listening", extra={"url": f"{scheme}://{settings.host}:{settings.port}/v1/"})
        if ssl_context is None:
            log.warning(
                "no --cert/--key: serving plain HTTP, which is only safe behind a TLS-terminating proxy on this host"
            )
        await stop.wait()
        log.info("landing endpoint stopping")
    finally:
        await runner.cleanup()
