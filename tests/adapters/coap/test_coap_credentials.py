"""The CoAP server's sensor credentials (adapters.coap.credentials): the watch that reloads them
outlives a failed reload, or a sensor added later could never authenticate until a restart."""

from __future__ import annotations

import asyncio
import os
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


def test_a_touched_context_keeps_its_sequence_numbers_and_only_a_new_key_starts_again(tmp_path: Path) -> None:
    """A sensor's settings.json whose modification time changed but not its key (touch, a backup
    restored, rsync without -t), then another sensor added: the loaded context stays, with its
    sequence numbers and replay window, and sequence.json stays. Without the fix it was taken for a
    reset: sequence.json deleted and the same key loaded again from sequence 0 (replays accepted,
    the gateway's nonces used twice). A real reset (a new key) still starts a new context."""
    oscore_sensors.create_sensor(tmp_path, "boiler")
    sensors = SensorCredentials(tmp_path)
    context = sensors.map[":boiler"]
    for _ in range(40):  # the gateway sent 40 protected messages: sequence.json written
        context.new_sequence_number()
    sequence = tmp_path / "boiler" / "sequence.json"
    assert sequence.is_file()
    settings = tmp_path / "boiler" / "settings.json"
    later = settings.stat().st_mtime_ns + 5_000_000_000
    os.utime(settings, ns=(later, later))
    oscore_sensors.create_sensor(tmp_path, "pump")  # the directory changed: a reload looks again
    sensors.reload()
    assert sensors.map[":boiler"] is context
    assert context.sender_sequence_number == 40
    assert sequence.is_file()
    assert ":pump" in sensors.map

    oscore_sensors.create_sensor(tmp_path, "boiler", reset=True)  # a new key
    sensors.reload()
    renewed = sensors.map[":boiler"]
    assert renewed is not context
    assert renewed.sender_sequence_number == 0
    assert renewed.recipient_id != context.recipient_id
    assert sensors.map[":pump"] is not None
