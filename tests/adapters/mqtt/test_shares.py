"""Each device's share of the MQTT intake (adapters.mqtt.shares): a flood is dropped only while others wait."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from adapters.mqtt.adapter import MqttAdapter
from adapters.mqtt.settings import MqttSettings
from adapters.mqtt.shares import ACTIVE_S, BACKLOG_S, BURST_S, DeviceShares, device_key
from broker.api import Engine, Scheduler
from gateway.client import InProcessTransport, SepaClient
from gateway.observations.writer import ObservationWriter
from tests.adapters.mqtt.test_mqtt_hostile import PLANT_MAPPING, bad_by_topic, config_file, publish, values, wait_for
from tools.launcher import launch_gateway
from tools.mosquitto import Mosquitto, until


def test_a_device_is_the_topic_level_the_acl_ties_to_a_login() -> None:
    # one login's conventions are one device
    assert device_key("senml/lamp") == "login:lamp"
    assert device_key("tele/lamp/SENSOR") == "login:lamp"
    assert device_key("gateway/lamp/temperature") == "login:lamp"
    assert device_key("homie/5/lamp/light/power") == "login:lamp"
    assert device_key("plant/boiler/a/b") == "plant/boiler"
    assert device_key("alone") == "alone"


def flood(shares: DeviceShares, topic: str, now: float, packs: int, readings: int, size: int = 0) -> int:
    """Offer `packs` messages of `readings` each (payloads of `size` bytes) at `now`; returns how many
    were admitted."""
    admitted = 0
    for _ in range(packs):
        if shares.admit(topic, now):
            shares.charge(topic, readings, size)
            admitted += 1
    return admitted


def test_a_device_over_its_share_is_dropped_while_another_device_sends() -> None:
    shares = DeviceShares(readings_per_s=100)
    assert shares.admit("gateway/victim/temperature", 0.0)
    # its saved-up burst (30 s of 100/s: 3,000) admits three packs of 1,200, the third into debt
    assert flood(shares, "senml/flood", 1.0, 50, 1200) == 3
    assert shares.dropped == 47
    assert shares.admit("gateway/victim/temperature", 1.0)  # the victim's budget is its own
    # the debt (600 readings) is paid back at 100 readings/s: nothing 5.9 s later, a pack at 6.1 s
    assert flood(shares, "senml/flood", 6.9, 1, 1200) == 0
    assert shares.admit("gateway/victim/temperature", 6.9)
    assert flood(shares, "senml/flood", 7.1, 5, 1200) == 1


def test_a_device_alone_may_run_a_backlog_into_debt() -> None:
    """A sensor flushing its buffer with nobody waiting: its burst and BACKLOG_S more of its share
    (3,000 + 12,000). Unbounded, a flood on a quiet gateway was mapped whole, and the first reading
    of another device waited behind it at the broker for hours."""
    shares = DeviceShares(readings_per_s=100)
    assert flood(shares, "senml/backlog", 0.0, 50, 1000) == 15
    assert shares.dropped == 35
    # another device that sent longer than ACTIVE_S ago waits for nothing
    shares.admit("gateway/other/temperature", 1.0)
    assert flood(shares, "senml/backlog", 1.0 + ACTIVE_S + 0.1, 3, 1000) == 3


def test_the_debt_stops_at_a_burst_and_a_backlog_and_the_budget_refills_to_one_burst() -> None:
    shares = DeviceShares(readings_per_s=10)
    burst = 10 * BURST_S
    floor_s = BURST_S + BACKLOG_S  # the deepest debt, in seconds of the share
    shares.admit("gateway/other/x", 0.0)
    assert flood(shares, "senml/big", 0.0, 1, 10**9) == 1  # one huge pack: the debt is capped
    shares.admit("gateway/other/x", floor_s - 1)
    assert flood(shares, "senml/big", floor_s - 1, 1, 1) == 0  # still in debt
    shares.admit("gateway/other/x", floor_s + 1)
    assert flood(shares, "senml/big", floor_s + 1, 1, int(burst)) == 1
    shares.admit("gateway/other/x", 1000 * floor_s)
    # idle for long, it saved up one burst only: one burst's worth, then a pack into debt, then nothing
    assert flood(shares, "senml/big", 1000 * floor_s, 5, int(burst) // 2) == 2


def test_a_message_costs_its_size_when_it_carries_fewer_readings() -> None:
    """A 62 KB pack that fails at its last record, or whose records carry no value, costs a whole
    parse: charged by its readings alone (none), a flood of them was never dropped."""
    shares = DeviceShares(readings_per_s=100)  # a burst of 3,000
    shares.admit("gateway/victim/temperature", 0.0)
    assert flood(shares, "senml/flood", 0.0, 50, 0, 62_000) == 5  # 620 each: 3,000 -> -100 after five
    assert flood(shares, "senml/small", 0.0, 3_000, 0, 5) == 3_000  # a payload of a few bytes costs one


def test_a_sensor_reporting_every_five_minutes_counts_as_waiting() -> None:
    """With a 10 s window a victim reporting every 15-60 s never counted as waiting: the flood ahead
    of it at the broker was mapped in full, and its readings came 27-72 s late."""
    shares = DeviceShares(readings_per_s=100)
    assert shares.admit("gateway/victim/temperature", 0.0)
    assert flood(shares, "senml/flood", 300.0, 50, 1200) == 3


def test_a_backlog_delivered_at_a_connect_may_take_backlog_s_more_of_the_share() -> None:
    """What the broker queued while the gateway was away arrives at once, though its senders kept to
    their share when they sent it: after a 200 s outage, 1,500-1,800 readings of a sensor sending a
    fifth of its share were dropped at the restart."""
    shares = DeviceShares(readings_per_s=100)  # a burst of 3,000, an allowance of 12,000
    shares.connected(0.0, first_after_s=0.05, resumed=True)
    assert shares.admit("gateway/other/temperature", 0.0)
    assert flood(shares, "senml/backlog", 0.0, 14, 1000) == 14
    assert shares.dropped == 0
    shares.caught_up()
    # caught up, what is left of the allowance goes: the burst's 3,000 at most, 1,000 of it left
    assert flood(shares, "senml/backlog", 0.0, 5, 1000) == 1


def test_a_flood_that_begins_after_the_connect_is_not_a_backlog() -> None:
    shares = DeviceShares(readings_per_s=100)
    shares.connected(0.0, first_after_s=5.0, resumed=True)
    assert shares.admit("gateway/other/temperature", 5.0)
    assert flood(shares, "senml/flood", 5.0, 50, 1000) == 3


def test_a_new_session_has_no_backlog() -> None:
    """The broker queued nothing for a session it did not keep: a flood at once after that connect
    is a flood."""
    shares = DeviceShares(readings_per_s=100)
    shares.connected(0.0, first_after_s=0.0, resumed=False)
    assert shares.admit("gateway/other/temperature", 0.0)
    assert flood(shares, "senml/flood", 0.0, 50, 1000) == 3


def test_a_flood_under_way_at_the_connect_gets_the_allowance_once() -> None:
    """A flood that outlasts the connect keeps the broker's queue full, so the gateway never catches
    up: it gets the allowance in readings, once, and is dropped as before after it."""
    shares = DeviceShares(readings_per_s=100)
    shares.connected(0.0, first_after_s=0.0, resumed=True)
    assert shares.admit("gateway/other/temperature", 0.0)
    assert flood(shares, "senml/flood", 1.0, 50, 1000) == 15
    assert flood(shares, "senml/flood", 1.0, 50, 1000) == 0
    # past BACKLOG_S the cap is one burst again, however long the device saved up
    assert flood(shares, "senml/flood", BACKLOG_S + 1, 50, 1000) == 3


def test_no_bound_when_the_rate_is_zero() -> None:
    shares = DeviceShares(readings_per_s=0)
    shares.admit("gateway/other/x", 0.0)
    assert flood(shares, "senml/flood", 0.0, 100, 10**6) == 100


def test_one_devices_flood_does_not_hold_back_the_other_devices(mosquitto: Mosquitto, tmp_path: Path) -> None:
    """One login's 300 SenML packs of 2,500 readings (~40 KB each, ~8 minutes of this machine's
    store time) are queued at the broker ahead of another device's readings. Its share spent, the
    flood is dropped (counted on its topic) and the other device's readings are stored within
    seconds; before, they waited behind all of it."""
    records = [{"bn": "f/", "n": "k0", "u": "Cel", "v": 0}] + [{"n": f"k{i % 200}", "v": i} for i in range(1, 2500)]
    pack = json.dumps(records).encode()
    messages = []
    for k in range(10):
        messages.append(("gateway/victim/temperature", str(k).encode()))
        messages += [("senml/flood", pack)] * 30
    gateway = launch_gateway(config=config_file(tmp_path, mosquitto))
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        publish(mosquitto.port, messages)
        wait_for(lambda: values(gateway, "gateway/victim/temperature") == list(range(10)), timeout=30)
        dropped = gateway.metrics()["sepa_mqtt_over_share_dropped"]
        assert dropped >= 250
        assert bad_by_topic(gateway) == {"senml/flood": dropped}
    finally:
        assert gateway.stop() == 0


def test_a_backlog_queued_during_an_outage_is_stored_whole(mosquitto: Mosquitto, tmp_path: Path) -> None:
    """While the gateway is stopped, device A sends 30 packs of 40 readings (1,200: four times its
    saved-up burst at 10 readings/s) and device B a reading between each, all queued by the broker for
    the gateway's session. At the restart both backlogs are stored whole; before, A's share ran out
    part-way and the rest of its packs were dropped while B's readings came in between."""
    config = config_file(tmp_path, mosquitto, "device_readings_per_s = 10\n")
    with launch_gateway(config=config) as gateway:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        assert gateway.stop() == 0
    messages = []
    for k in range(30):
        records = [{"bn": "A/", "bt": 1_700_000_000 + k, "n": f"r{i}", "u": "Cel", "v": k} for i in range(40)]
        messages += [("senml/A", json.dumps(records).encode()), ("gateway/B/temperature", str(k).encode())]
    publish(mosquitto.port, messages)
    gateway = launch_gateway(config=config)
    try:
        wait_for(lambda: values(gateway, "gateway/B/temperature") == list(range(30)), timeout=30)
        wait_for(lambda: len(values(gateway, "senml/A")) == 1200, timeout=30)
        assert gateway.metrics()["sepa_mqtt_over_share_dropped"] == 0
        assert bad_by_topic(gateway) == {}
    finally:
        assert gateway.stop() == 0


def test_a_flood_on_a_quiet_gateway_does_not_hide_another_devices_first_reading(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """No other device has sent, so the flooder is alone: 200 packs of 40 readings, then the first
    reading ever of another device, behind them at the broker. The flooder gets its burst and a
    backlog's allowance (300 + 1,200 readings at 10/s) and is dropped past it; before, all 8,000
    readings were mapped, and a real flood held the other device back for hours. The session is new,
    so the flood right after the connect is no backlog (taken for one, 68 packs got through)."""
    gateway = launch_gateway(config=config_file(tmp_path, mosquitto, "device_readings_per_s = 10\n"))
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        records = [{"bn": "A/", "n": f"r{i}", "u": "Cel", "v": i} for i in range(40)]
        publish(mosquitto.port, [("senml/A", json.dumps(records).encode())] * 200 + [("gateway/B/temperature", b"7")])
        wait_for(lambda: values(gateway, "gateway/B/temperature") == [7.0], timeout=30)
        assert gateway.metrics()["sepa_mqtt_over_share_dropped"] >= 150
    finally:
        assert gateway.stop() == 0


def test_a_wall_clock_step_after_the_connect_does_not_make_a_flood_a_backlog(
    mosquitto: Mosquitto, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway resumes its session with nothing queued; then the wall clock steps back an hour
    (NTP setting a board's clock after boot) and a flood begins 1.5 s after the connect. The delay
    from CONNACK to the first message was measured by the wall clock: -3,598 s, so the flood was
    taken for a backlog and given BACKLOG_S more of its share (68 of 200 packs of 40 readings through,
    132 dropped). Measured by the monotonic clock it is 1.5 s, no backlog: 162 dropped, as without a
    step (test_a_flood_on_a_quiet_gateway_does_not_hide_another_devices_first_reading)."""
    settings = MqttSettings(
        host="127.0.0.1", port=mosquitto.port, client_id="gw-step", device_readings_per_s=10, batch_wait_ms=5
    )

    async def run(flood: bool) -> int:
        client = SepaClient(InProcessTransport(Scheduler(Engine())))
        adapter = MqttAdapter(client, settings, writer=ObservationWriter(client, "gw"))
        await adapter.start()
        try:
            await until(lambda: adapter.connection.stats.subscribed, what="subscribed")
            if not flood:
                return 0
            assert adapter.connection.session_resumed
            stepped = time.time_ns() - 3600 * 10**9
            monkeypatch.setattr(time, "time_ns", lambda: stepped + time.monotonic_ns() - began)
            began = time.monotonic_ns()
            await asyncio.sleep(1.5)
            records = [{"bn": "A/", "n": f"r{i}", "u": "Cel", "v": i} for i in range(40)]
            packs = [("senml/A", json.dumps(records).encode())] * 200 + [("gateway/B/temperature", b"7")]
            await asyncio.to_thread(publish, mosquitto.port, packs)
            await until(lambda: adapter.ingestor.stats.acked >= 201, timeout=60, what="the flood taken")
            return adapter.shares.dropped
        finally:
            await adapter.stop()

    asyncio.run(run(flood=False))  # the session, with its subscriptions, for the next start to resume
    assert asyncio.run(run(flood=True)) >= 150


def test_a_templated_grant_shares_one_budget_across_its_topics(mosquitto: Mosquitto, tmp_path: Path) -> None:
    """A login granted plant/+/temperature for a mapping plant/{room}/temperature: each topic was a
    device of its own (its first two levels, plant/<room>), so spreading a flood over 20 rooms gave
    it 20 shares. 4,000 readings (200 a room) while another device waits were all mapped at 10
    readings/s a device: none dropped. Now the mapping's topics are one device
    (`mqtt.mapping_readings_per_s`, by default the device's share), and the flood past its 300-reading
    burst is dropped."""
    config = config_file(tmp_path, mosquitto, "device_readings_per_s = 10\n" + PLANT_MAPPING)
    gateway = launch_gateway(config=config)
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        publish(mosquitto.port, [("gateway/B/temperature", b"1")])
        wait_for(lambda: values(gateway, "gateway/B/temperature") == [1.0])
        flood = [(f"plant/r{n % 20}/temperature", str(n).encode()) for n in range(4_000)]
        publish(mosquitto.port, [*flood, ("gateway/B/temperature", b"2")])
        wait_for(lambda: values(gateway, "gateway/B/temperature") == [1.0, 2.0], timeout=60)
        dropped = gateway.metrics()["sepa_mqtt_over_share_dropped"]
        assert dropped >= 3_000
        assert sum(bad_by_topic(gateway).values()) == dropped
    finally:
        assert gateway.stop() == 0
