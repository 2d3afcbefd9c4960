"""CoAP sensors on the network authenticate with OSCORE contexts made by `sepa-gateway sensors add --coap`.

Real parts: the CLI as a subprocess, the gateway as the installed service runs it (--secure, a data
directory), aiocoap's client speaking OSCORE to the gateway's network address over real UDP.
"""

from __future__ import annotations

import asyncio
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiocoap
import pytest
from aiocoap import Code

from adapters.coap.credentials import RELOAD_INTERVAL_S
from tests.support.coap import CLI, DEG_C, SENSOR, add_sensor, host_address, observations, post, sensor_side


async def accepted_within(uri: str, payload: bytes, context_dir: Path, seconds: float) -> bool:
    """POST until the gateway takes it, from one client context: aiocoap locks a context directory
    while a context object holds it, and a failed attempt's object may outlive the attempt."""
    context = await aiocoap.Context.create_client_context()
    context.client_credentials.load_from_dict(
        {uri.rsplit("/s/", 1)[0] + "/*": {"oscore": {"basedir": str(context_dir) + "/"}}}
    )
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            try:
                message = aiocoap.Message(code=Code.POST, uri=uri, payload=payload)
                if (await asyncio.wait_for(context.request(message).response, 10)).code == Code.CHANGED:
                    return True
            except Exception:  # an unprotected 4.01 (unknown kid), which the client does not take as an answer
                pass
            await asyncio.sleep(0.5)
        return False
    finally:
        await context.shutdown()


def test_a_sensor_with_its_oscore_context_is_taken_from_the_network_and_others_are_not(start_gateway, tmp_path) -> None:
    data = tmp_path / "data"
    settings = add_sensor(data / "coap-sensors", "boiler")
    assert set(settings) == {"sender-id_hex", "recipient-id_hex", "secret_hex", "salt_hex"}
    gateway = start_gateway("--secure", "--host", "0.0.0.0", data_dir=data, coap=True)
    port = int(gateway.coap_url.rsplit(":", 1)[1])
    uri = f"coap://{host_address()}:{port}/s/boiler/temperature"

    response = asyncio.run(post(uri, b"64.5", sensor_side(tmp_path, "boiler", settings)))
    assert response.code == Code.CHANGED, response
    assert observations(gateway) == [(SENSOR + "boiler", 64.5, DEG_C)]

    plain = asyncio.run(post(uri, b"1", None))
    assert plain.code == Code.UNAUTHORIZED, plain
    forged = dict(settings, secret_hex="00" * 16)
    try:  # the gateway cannot decrypt it: an unprotected 4.00 (RFC 8613 §8.2), which the client refuses
        refused = asyncio.run(post(uri, b"2", sensor_side(tmp_path, "forger", forged)))
    except Exception as error:  # aiocoap: NotAProtectedMessage, the answer is not from the sensor's context
        assert "4.00" in repr(error) or "Protected" in type(error).__name__, error
    else:
        assert not refused.code.is_successful(), refused
    assert observations(gateway) == [(SENSOR + "boiler", 64.5, DEG_C)]  # neither stored

    later = add_sensor(data / "coap-sensors", "pump")  # while the gateway runs: no restart
    pump = sensor_side(tmp_path, "pump", later)
    taken = asyncio.run(accepted_within(uri.replace("boiler", "pump"), b"3", pump, 15))  # 4.01 until loaded
    assert taken, "a sensor added while running is never taken"
    assert (SENSOR + "pump", 3.0, DEG_C) in observations(gateway)


async def oscore_requests(base: str, context_dir: Path, *requests: tuple[Code, str, bytes]) -> list[aiocoap.Message]:
    """The requests in order, from one client context (aiocoap locks a context directory while it is loaded)."""
    context = await aiocoap.Context.create_client_context()
    try:
        context.client_credentials.load_from_dict({base + "/*": {"oscore": {"basedir": str(context_dir) + "/"}}})
        answers = []
        for code, path, payload in requests:
            message = aiocoap.Message(code=code, uri=base + path, payload=payload)
            answers.append(await asyncio.wait_for(context.request(message).response, 30))
        return answers
    finally:
        await context.shutdown()


def test_an_authenticated_sensor_follows_exposed_subscriptions_but_cannot_create_its_own(
    start_gateway, tmp_path
) -> None:
    """Its OSCORE identity carries no graph rights: it may follow what [[coap.subscriptions]]
    exposes, never read the store with SPARQL of its own (4.03), which this board still may."""
    data = tmp_path / "data"
    settings = add_sensor(data / "coap-sensors", "valve")
    toml = '[[coap.subscriptions]]\nname = "open"\nsparql = "SELECT ?v WHERE { ?v <urn:example:open> true }"\n'
    gateway = start_gateway("--secure", "--host", "0.0.0.0", data_dir=data, coap=True, toml=toml)
    port = int(gateway.coap_url.rsplit(":", 1)[1])
    base = f"coap://{host_address()}:{port}"
    assert gateway.update("INSERT DATA { <urn:example:v1> <urn:example:open> true }").status == 200
    side = sensor_side(tmp_path, "valve", settings)

    everything = b"SELECT * WHERE { GRAPH ?g { ?s ?p ?o } }"
    shown, created = asyncio.run(
        oscore_requests(base, side, (Code.GET, "/q/open", b""), (Code.POST, "/q?name=all", everything))
    )
    assert shown.code == Code.CONTENT, shown
    assert "urn:example:v1" in shown.payload.decode()
    assert created.code == Code.FORBIDDEN, created
    local = asyncio.run(post(f"coap://127.0.0.1:{port}/q?name=all", b"SELECT ?s WHERE { ?s ?p ?o }", None))
    assert local.code == Code.CREATED, local


def allow(directory: Path, name: str, *patterns: str) -> None:
    done = subprocess.run(
        [*CLI, "sensors", "allow", name, "--coap", "--coap-dir", str(directory), *(f"--path={p}" for p in patterns)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_a_sensor_posts_to_its_own_resources_and_to_the_paths_it_is_allowed_only(start_gateway, tmp_path) -> None:
    """A key taken from one device must not write another sensor's readings: 4.03, nothing stored,
    until `sensors --coap allow` grants the path (no restart)."""
    data = tmp_path / "data"
    settings = add_sensor(data / "coap-sensors", "boiler")
    gateway = start_gateway("--secure", "--host", "0.0.0.0", data_dir=data, coap=True)
    port = int(gateway.coap_url.rsplit(":", 1)[1])
    base = f"coap://{host_address()}:{port}"
    side = sensor_side(tmp_path, "boiler", settings)

    async def scenario() -> tuple[Any, ...]:
        context = await aiocoap.Context.create_client_context()  # one: aiocoap locks a context directory
        context.client_credentials.load_from_dict({base + "/*": {"oscore": {"basedir": str(side) + "/"}}})

        async def post(path: str, payload: bytes) -> aiocoap.Message:
            message = aiocoap.Message(code=Code.POST, uri=base + path, payload=payload)
            return await asyncio.wait_for(context.request(message).response, 30)

        try:
            own, other = await post("/s/boiler/temperature", b"61.5"), await post("/s/pump/temperature", b"99")
            stored_before = observations(gateway)
            allow(data / "coap-sensors", "boiler", "s/+/temperature")
            deadline = time.monotonic() + 15
            granted = await post("/s/pump/temperature", b"42")
            while granted.code != Code.CHANGED and time.monotonic() < deadline:  # read within its reload interval
                await asyncio.sleep(0.5)
                granted = await post("/s/pump/temperature", b"42")
            return own, other, stored_before, granted, await post("/s/pump/humidity", b"40")
        finally:
            await context.shutdown()

    own, other, stored_before, granted, humidity = asyncio.run(scenario())
    assert own.code == Code.CHANGED, own
    assert other.code == Code.FORBIDDEN, other
    assert "boiler" in other.payload.decode()
    assert stored_before == [(SENSOR + "boiler", 61.5, DEG_C)]
    assert granted.code == Code.CHANGED, granted
    assert (SENSOR + "pump", 42.0, DEG_C) in observations(gateway)
    assert humidity.code == Code.FORBIDDEN, humidity  # the pattern, not more


# an OSCORE sensor observing URI from its context DIR, in its own process: one stdout line per
# notification ("notification"), "ended" when the observation ends. A process: aiocoap's client
# raises the ending 4.01 again when its iterators are collected, and collected during a later
# compile in the test process it broke pytest's assertion rewriting (SystemError)
OBSERVER = """
import asyncio, sys, aiocoap
async def main():
    context = await aiocoap.Context.create_client_context()
    base = sys.argv[1].rsplit("/q/", 1)[0]
    context.client_credentials.load_from_dict({base + "/*": {"oscore": {"basedir": sys.argv[2] + "/"}}})
    request = context.request(aiocoap.Message(code=aiocoap.GET, uri=sys.argv[1], observe=0))
    print("first", (await request.response).code, flush=True)
    try:
        async for notification in request.observation:
            print("notification", notification.code, flush=True)
    except Exception as error:
        print("ended", type(error).__name__, flush=True)
    else:
        print("ended", flush=True)
asyncio.run(main())
"""


@pytest.mark.parametrize("change", ["remove", "reset"])
def test_a_removed_sensors_observation_ends_quietly_and_its_key_is_refused(start_gateway, tmp_path, change) -> None:
    """A sensor follows /q/open over OSCORE; its credential is removed (or reset) while it observes. The next
    change ends the observation (an unprotected 4.01, counted in sepa_coap_oscore_ended_released),
    with no ERROR traceback, the gateway's observer gone, and the key refused afterwards. Without
    the fix each notification of a released context wrote ~30 lines of ERROR traceback (aiocoap
    writing its sequence file into the removed folder, or using the destroyed keys)."""
    data = tmp_path / "data"
    settings = add_sensor(data / "coap-sensors", "valve")
    toml = '[[coap.subscriptions]]\nname = "open"\nsparql = "SELECT ?v WHERE { ?v <urn:example:open> true }"\n'
    gateway = start_gateway("--secure", "--host", "0.0.0.0", data_dir=data, coap=True, toml=toml)
    port = int(gateway.coap_url.rsplit(":", 1)[1])
    base = f"coap://{host_address()}:{port}"
    side = sensor_side(tmp_path, "valve", settings)

    def insert(number: int) -> None:
        assert gateway.update(f"INSERT DATA {{ <urn:example:v{number}> <urn:example:open> true }}").status == 200

    lines: queue.Queue[str] = queue.Queue()
    observer = subprocess.Popen(
        [sys.executable, "-c", OBSERVER, base + "/q/open", str(side)], stdout=subprocess.PIPE, text=True
    )
    assert observer.stdout is not None
    threading.Thread(target=lambda: [lines.put(line.strip()) for line in observer.stdout], daemon=True).start()
    try:
        assert lines.get(timeout=30).startswith("first 2.05")
        insert(1)
        assert lines.get(timeout=30).startswith("notification 2.05")
        how = ["remove", "valve"] if change == "remove" else ["add", "valve", "--reset"]
        removed = subprocess.run(
            [*CLI, "sensors", "--coap", "--coap-dir", str(data / "coap-sensors"), *how], capture_output=True, timeout=60
        )
        assert removed.returncode == 0, removed.stderr
        if change == "remove":
            gateway.wait_for_metric("sepa_coap_oscore_sensors", lambda count: count == 0, timeout=15)
        else:
            time.sleep(3 * RELOAD_INTERVAL_S)  # the same count: the reload is not seen in the metrics
        insert(2)
        assert lines.get(timeout=15).startswith("ended"), "the observation went on"
    finally:
        observer.kill()
        observer.wait()
    assert not [line for line in gateway.stderr_lines if "level=error" in line or "Traceback" in line]
    assert gateway.metric("sepa_coap_oscore_ended_released") == 1
    gateway.wait_for_metric("sepa_coap_q_observers", lambda count: count == 0)
    try:  # the removed key is refused: an unprotected 4.01, not an answer of the sensor's context
        refused = asyncio.run(post(base + "/s/valve/temperature", b"1", side)).code
    except Exception as error:
        refused = error
    assert not isinstance(refused, Code) or not refused.is_successful(), refused
    assert observations(gateway) == []  # the removed key wrote nothing
