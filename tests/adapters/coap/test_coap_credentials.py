"""The CoAP server's sensor credentials (adapters.coap.credentials): the watch that reloads them
outlives a failed reload, or a sensor added later could never authenticate until a restart."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from aiocoap import Code

import adapters.coap.credentials as credentials_module
from adapters.coap.credentials import SensorCredentials
from gateway.appliance import oscore_sensors
from tests.support.coap import DEG_C, SENSOR, add_sensor, host_address, observations, post, sensor_side


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


@pytest.mark.parametrize("damaged", ["", "garbage", '{"next-to-send": 7}'])
def test_a_damaged_sequence_file_refuses_its_sensor_in_one_line_and_stays_as_it_was(
    start_gateway, tmp_path: Path, damaged: str
) -> None:
    """A sensor's sequence.json empty, not JSON, or without its replay window (a disk that lost it,
    an edit): the gateway as installed says so in one error line naming the sensor and the way out
    (a new key), with no traceback, refuses that sensor and takes the others, and leaves the file as
    it was. Without the fix aiocoap's destructor printed an "Exception ignored" AttributeError
    traceback after the error line, and for the third file rewrote it into a loadable one (an empty
    replay window), so the next start took the key it had refused."""
    data = tmp_path / "data"
    folder = data / "coap-sensors"
    boiler = add_sensor(folder, "boiler")
    pump = add_sensor(folder, "pump")
    sequence = folder / "boiler" / "sequence.json"
    sequence.write_text(damaged)
    gateway = start_gateway("--secure", "--host", "0.0.0.0", data_dir=data, coap=True)
    port = int(gateway.coap_url.rsplit(":", 1)[1])
    uri = f"coap://{host_address()}:{port}/s/%s/temperature"

    taken = asyncio.run(post(uri % "pump", b"21.5", sensor_side(tmp_path, "pump", pump)))
    assert taken.code == Code.CHANGED, taken
    try:  # no context for its kid: an unprotected 4.01, which aiocoap's client does not take as an answer
        refused: object = asyncio.run(post(uri % "boiler", b"99", sensor_side(tmp_path, "boiler", boiler))).code
    except Exception as error:
        refused = error
    assert not isinstance(refused, Code) or not refused.is_successful(), refused
    assert observations(gateway) == [(SENSOR + "pump", 21.5, DEG_C)]
    gateway.stop()

    assert not [line for line in gateway.stderr_lines if "Traceback" in line or "Exception ignored" in line]
    assert sequence.read_text() == damaged
    errors = [line for line in gateway.stderr_lines if "level=error" in line]
    assert len(errors) == 1, errors
    assert "sensor=boiler" in errors[0] and "sequence.json" in errors[0] and "--reset" in errors[0], errors[0]


def test_a_sequence_file_is_durable_before_the_numbers_it_reserves_are_used(start_gateway, tmp_path: Path) -> None:
    """The gateway as installed, traced (strace on every thread): its first protected response
    reserves sequence numbers (aiocoap renames a new sequence.json over the old), and the sensor's
    directory is synced after that rename and before the response leaves. Without the fix the
    rename was never followed by an fsync of the directory: a power cut within the file system's
    commit interval brought back the previous sequence.json, and the next start sent its numbers
    (AES-CCM nonces under the same key) a second time."""
    if shutil.which("strace") is None:
        pytest.fail("strace is not installed (tests/run.sh installs it)", pytrace=False)
    data = tmp_path / "data"
    folder = data / "coap-sensors"
    boiler = add_sensor(folder, "boiler")
    gateway = start_gateway("--secure", "--host", "0.0.0.0", data_dir=data, coap=True)
    port = int(gateway.coap_url.rsplit(":", 1)[1])
    trace = tmp_path / "trace"
    argv = ["strace", "-f", "-y", "-o", str(trace), "-e", "trace=rename,renameat,renameat2,fsync,sendto,sendmsg"]
    for thread in os.listdir(f"/proc/{gateway.process.pid}/task"):
        argv += ["-p", thread]
    tracer = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)  # attached
        uri = f"coap://{host_address()}:{port}/s/boiler/temperature"
        taken = asyncio.run(post(uri, b"21.5", sensor_side(tmp_path, "boiler", boiler)))
        assert taken.code == Code.CHANGED, taken
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=30)
    gateway.stop()

    lines = trace.read_text().splitlines()
    renamed = [index for index, line in enumerate(lines) if "rename" in line and "sequence.json" in line]
    assert renamed, "no sequence.json written: the response reserved no sequence numbers"
    after = range(renamed[0] + 1, len(lines))
    sent = [index for index in after if "sendmsg(" in lines[index] and "AF_INET" in lines[index]]
    assert sent, "no response sent after the sequence file was written"
    synced = [
        index
        for index, line in enumerate(lines[: sent[0]])
        if index > renamed[0] and re.search(r"fsync\(\d+<" + re.escape(str(folder / "boiler")) + r">\)", line)
    ]
    assert synced, "sequence.json renamed and the response sent, its directory never synced in between"
