"""The CoAP server's sensor credentials (adapters.coap.credentials): the watch that reloads them
outlives a failed reload, or a sensor added later could never authenticate until a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import adapters.coap.credentials as credentials_module
from adapters.coap.credentials import SensorCredentials
from gateway.appliance import oscore_sensors


def test_the_watch_outlives_a_failed_reload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first reload of the watch raises (a fake: a damaged directory the test cannot make
    fail this way for root); the watch logs it, and the next tick tries that reload again (the
    directory did not change in between, so it is retried because it failed)."""
    monkeypatch.setattr(credentials_module, "RELOAD_INTERVAL_S", 0.01)
    real = oscore_sensors.credentials
    calls: list[int] = []

    def failing_once(directory: Path) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 2:  # the first call is the constructor's; the second the watch's first
            raise RuntimeError("a damaged credentials directory")
        return real(directory)

    monkeypatch.setattr(oscore_sensors, "credentials", failing_once)

    async def run() -> bool:
        sensors = SensorCredentials(tmp_path)
        (tmp_path / "new-sensor-directory").mkdir()  # the directory changed: the watch reloads
        sensors.start()
        try:
            for _ in range(200):
                await asyncio.sleep(0.02)
                if len(calls) >= 3:
                    break
            return sensors._task is not None and not sensors._task.done()  # noqa: SLF001
        finally:
            await sensors.stop()

    assert asyncio.run(run())
    assert len(calls) >= 3
