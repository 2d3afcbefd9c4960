"""The smart lighting example (examples/smart_lighting) reproduces Fig. 2 of seed 001, over both transports.

What it protects: event negation with a delayed update (seed 001 §II-C/D). A presence switches the
lamp ON at once and the lamp actuator is notified; an absence at t1 schedules a delayed OFF; a
presence and a new absence at t2 within Δt schedule a second one. At t1 + Δt the first delayed
OFF runs (it is no longer pending) but changes nothing, because the sensor's timestamp changed
meanwhile: the lamp stays ON and the actuator hears nothing. At t2 + Δt the second one switches
the lamp OFF and the actuator is notified, never before that due time. The application keeps no
timer and cancels nothing. Also: the runnable demo over the network and in-process.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from examples.smart_lighting.smart_lighting import (
    LIGHTING_JSAP,
    LampActuator,
    PresenceSensor,
    SmartLighting,
    lamp_posts,
    lamp_status,
    main,
    until_run,
)
from gateway.client import Producer, Scheduled, UpdateSummary
from gateway.jsap import Jsap
from tests.gateway.client.client_support import Connect, eventually, run
from tools.launcher import RunningGateway

ROOT = Path(__file__).resolve().parents[2]

DELAY_MS = 500  # Δt: the second absence comes Δt/2 after the first, so the two OFFs are Δt/2 apart


def test_fig2_the_first_delayed_off_changes_nothing_the_second_switches_off(connect: Connect) -> None:
    jsap = Jsap.load(LIGHTING_JSAP)
    lamp, sensor_iri = lamp_posts(jsap)[0]
    delta = timedelta(milliseconds=DELAY_MS)

    async def body() -> None:
        async with connect() as sensor_client, connect() as lamp_client, connect() as lighting_client:
            await Producer(sensor_client, jsap, "INSTALL_LAMP_POST").produce(lamp=lamp, sensor=sensor_iri)
            sensor = PresenceSensor(sensor_client, jsap, sensor_iri)
            actuator = LampActuator(lamp_client, jsap, lamp)
            lighting = SmartLighting(lighting_client, jsap, delay=DELAY_MS)
            async with actuator, lighting:
                assert actuator.initial == "OFF" and actuator.changes == [] and lighting.scheduled == []

                # presence: the lamp goes ON at once
                assert isinstance(await sensor.report(True), UpdateSummary)
                await eventually(lambda: actuator.statuses == ["ON"], what="lamp ON")
                assert await lamp_status(lamp_client, jsap, lamp) == "ON"
                assert lighting.scheduled == [] and await lighting_client.scheduled() == []

                # t1, no presence: a delayed OFF, due t1 + Δt; nothing switched yet
                t1 = datetime.now(UTC)
                await sensor.report(False)
                await eventually(lambda: len(lighting.scheduled) == 1, what="first delayed OFF")
                first = lighting.scheduled[0]
                assert t1 + delta <= first.due <= datetime.now(UTC) + delta
                (pending,) = await lighting_client.scheduled()
                assert pending.id == first.id and pending.update is not None and "sl:OFF" in pending.update
                assert actuator.statuses == ["ON"]

                # presence again within Δt, then t2, no presence: a second delayed OFF
                await asyncio.sleep(DELAY_MS / 2000)
                await sensor.report(True)
                await sensor.report(False)
                await eventually(lambda: len(lighting.scheduled) == 2, what="second delayed OFF")
                second = lighting.scheduled[1]
                assert datetime.now(UTC) < first.due < second.due  # both pending at once
                assert [entry.id for entry in await lighting_client.scheduled()] == [first.id, second.id]
                assert lighting.switched_on == 2  # the second ON changed nothing: no notification
                assert actuator.statuses == ["ON"]

                # t1 + Δt: the first OFF runs (no longer pending) and changes nothing
                await until_run(lighting_client, first, 5)
                assert datetime.now(UTC) >= first.due
                assert [entry.id for entry in await lighting_client.scheduled()] == [second.id]
                assert await lamp_status(lighting_client, jsap, lamp) == "ON"
                assert actuator.statuses == ["ON"]  # no OFF reached the actuator

                # t2 + Δt: the second OFF switches the lamp off, and the actuator is notified
                await eventually(lambda: actuator.statuses == ["ON", "OFF"], timeout=5, what="lamp OFF")
                assert actuator.changes[-1].received >= second.due
                assert await lamp_status(lighting_client, jsap, lamp) == "OFF"
                assert await lighting_client.scheduled() == []
                await asyncio.sleep(0.1)
                assert actuator.statuses == ["ON", "OFF"]  # exactly: nothing else came
                assert [change.sequence for change in actuator.changes] == [1, 2]
                assert lighting.failures == 0 and len(lighting.scheduled) == 2
            await Producer(sensor_client, jsap, "REMOVE_LAMP_POST").produce(lamp=lamp)
            assert await lamp_status(sensor_client, jsap, lamp) is None

    run(body(), timeout=30)


def test_a_presence_already_reported_is_handled_when_the_aggregator_starts(connect: Connect) -> None:
    """An absence in the aggregator's first result schedules an OFF too; the JSAP's Δt by default."""
    jsap = Jsap.load(LIGHTING_JSAP)
    lamp, sensor_iri = lamp_posts(jsap)[0]

    async def body() -> None:
        async with connect() as client:
            await Producer(client, jsap, "INSTALL_LAMP_POST").produce(lamp=lamp, sensor=sensor_iri)
            await Producer(client, jsap, "SWITCH_ON").produce(lamp=lamp)
            await PresenceSensor(client, jsap, sensor_iri).report(False)
            lighting = SmartLighting(client, jsap)  # SWITCH_OFF's own delay: PT2S
            async with lighting:
                await eventually(lambda: len(lighting.scheduled) == 1, what="OFF from the first result")
            (scheduled,) = lighting.scheduled
            assert isinstance(scheduled, Scheduled)
            (pending,) = await client.scheduled()
            assert pending.created is not None and pending.due - pending.created >= timedelta(seconds=1.9)
            await client.cancel_scheduled(scheduled)
            assert await lamp_status(client, jsap, lamp) == "ON"
            await Producer(client, jsap, "REMOVE_LAMP_POST").produce(lamp=lamp)

    run(body())


def test_main_over_the_network(gateway: RunningGateway) -> None:
    gateway.post_update("DROP ALL")
    command = [sys.executable, "-m", "examples.smart_lighting.smart_lighting", "--delay", "400"]
    command += ["--url", f"http://127.0.0.1:{gateway.http_port}", "--ws-url", gateway.subscribe_url]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert sum("OFF scheduled" in line for line in lines) == 2
    assert sum("first delayed OFF ran, Lamp1 is still ON" in line for line in lines) == 1
    assert [line.split("lamp-actuator: ")[1] for line in lines if "is now" in line] == [
        "Lamp1 is now ON",
        "Lamp1 is now OFF",
    ]
    assert lines[-1].endswith("the lamp actuator saw ON -> OFF: OFF only Δt after the last presence")
    assert done.stderr == ""


def test_main_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--inprocess", "--delay", "PT0.3S"]) == 0
    out = capsys.readouterr().out
    assert "Δt = 0.3 s" in out and out.splitlines()[-1].endswith("saw ON -> OFF: OFF only Δt after the last presence")


def test_main_reports_a_bad_delay_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--inprocess", "--delay", "soon"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "delay must be milliseconds or an ISO 8601 duration" in err
