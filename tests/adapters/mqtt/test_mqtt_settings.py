"""Settings validation, topic filter checks and per-topic bad-input counters (no broker needed)."""

from __future__ import annotations

import logging

import pytest

from adapters.mqtt.connection import MqttError, check_filter
from adapters.mqtt.settings import MqttSettings, MqttSettingsError, TlsSettings
from adapters.mqtt.shares import device_key
from gateway.observations.counters import MAX_PER_DEVICE, OTHER_TOPICS, SourceCounters


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"port": 0}, "port must be 1..65535"),
        ({"client_id": ""}, "client_id must be 1-128 characters"),
        ({"protocol": "3.1"}, "protocol must be one of 3.1.1, 5"),
        ({"password": "x"}, "password given without username"),
        ({"tls": TlsSettings(key="k.pem")}, "tls.key given without tls.cert"),
        ({"keepalive": 0}, "keepalive must be 5..65535"),
        ({"qos": 2}, "qos must be 1"),
        ({"session_expiry_s": 0}, "session_expiry_s must be 1.."),
        ({"reconnect_min_s": 5, "reconnect_max_s": 1}, "0 < min <= max"),
        ({"batch_max": 0}, "batch_max must be >= 1"),
        ({"batch_max": 600, "receive_maximum": 500}, "receive_maximum must be batch_max (600)..65535"),
        ({"batch_wait_ms": -1}, "batch_wait_ms must be 0..10000"),
        ({"max_payload_bytes": 0}, "max_payload_bytes must be 1.."),
    ],
)
def test_bad_settings_give_one_clear_line(overrides: dict, message: str) -> None:
    with pytest.raises(MqttSettingsError, match="^mqtt: ") as error:
        MqttSettings(**overrides)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_defaults_are_valid_and_the_password_is_never_shown() -> None:
    settings = MqttSettings(username="gw", password="hunter2-secret")
    assert settings.qos == 1 and settings.protocol == "5"
    assert "hunter2-secret" not in repr(settings)


@pytest.mark.parametrize("good", ["a/b", "a/+/c", "#", "a/#", "+", "homie/5/+/+/+"])
def test_valid_filters(good: str) -> None:
    assert check_filter(good) == good


# control characters, a C1 control (NEL), non-characters: Mosquitto drops a SUBSCRIBE holding one as
# malformed, and with it every other filter of the packet
@pytest.mark.parametrize(
    "bad", ["", "a/#/b", "a/b#", "a+/b", "a/\0", "evil\x01x/+", "a/\x7f", "a/\x85", "a/\ufffe", "a/\U0001ffff"]
)
def test_malformed_filters_are_refused(bad: str) -> None:
    with pytest.raises(MqttError, match="invalid topic filter"):
        check_filter(bad)


def test_bad_topics_are_logged_at_most_once_a_minute_with_their_count(caplog) -> None:
    now = [0.0]
    counters = SourceCounters(clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="adapters.mqtt.ingest"):
        for _ in range(1000):
            counters.add("zigbee2mqtt/kitchen", "not JSON")
        now[0] = 59.0
        counters.add("zigbee2mqtt/kitchen", "not JSON")
        now[0] = 61.0
        counters.add("zigbee2mqtt/kitchen", "not JSON")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "(1 since the last report, 1 in total)" in lines[0]
    assert "(1001 since the last report, 1002 in total)" in lines[1]
    assert counters.counts == {"zigbee2mqtt/kitchen": 1002} and counters.total == 1002


def test_many_bad_sources_write_a_bounded_number_of_lines(caplog) -> None:
    """1,000 junk topics (or CoAP paths) were 1,000 warnings, again every minute: now at most
    max_reports lines an interval, and one line saying how many sources were held back."""
    now = [0.0]
    counters = SourceCounters(clock=lambda: now[0], max_reports=20)
    with caplog.at_level(logging.WARNING):
        for minute in range(3):
            now[0] = minute * 60.0
            for i in range(1000):
                counters.add(f"junk/{i}", "unmapped topic")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 * 20 + 2
    held = "980 more sources had bad input that was not reported in the last 60 s (counts on /metrics)"
    assert lines[20].endswith(held) and lines[41].endswith(held)
    assert counters.total == 3000 and counters.counts["junk/999"] == 3


def test_topic_counters_do_not_grow_without_bound() -> None:
    counters = SourceCounters(max_topics=3)
    for i in range(100):
        counters.add(f"spam/{i}", "unmapped topic")
    assert len(counters.counts) == 4
    assert counters.counts[OTHER_TOPICS] == 97


def test_one_device_cannot_take_every_source_slot() -> None:
    """One login's junk topics took all 1,000 per-source slots, so every other device's bad input
    went under OTHER_TOPICS: a device now holds at most MAX_PER_DEVICE of them. The MQTT adapter's
    device is the login the ACL ties the topic to, whatever the convention (shares.device_key)."""
    counters = SourceCounters()
    for i in range(1200):
        counters.add(f"gateway/boiler/junk{i}", "unknown property")
    counters.add("gateway/kitchen/temperature", "not a number")
    assert counters.counts.get("gateway/kitchen/temperature") == 1
    assert len([source for source in counters.counts if "boiler" in source]) == MAX_PER_DEVICE
    assert counters.counts[OTHER_TOPICS] == 1200 - MAX_PER_DEVICE

    by_login = SourceCounters(device_of=device_key)
    for i in range(300):
        by_login.add(f"gateway/boiler/junk{i}", "unknown property")
        by_login.add(f"homie/5/boiler/n/junk{i}", "unknown unit")
    by_login.add("senml/pump", "not SenML")
    assert by_login.counts["senml/pump"] == 1
    assert len([source for source in by_login.counts if "boiler" in source]) == MAX_PER_DEVICE
    assert by_login.total == 601
