"""Label values on /metrics come from sensors and LAN hosts (topics, CoAP paths): whatever they
hold, each stays one label of one sample, and two long ones stay two series."""

from __future__ import annotations

from broker.gates.server import LABEL_CHARS, label_value


def test_no_character_splits_a_sample_for_any_line_reader() -> None:
    forged = "s/x\rsepa_mqtt_readings 999999\r/t\x0b\x0c\x1c\x85\u2028\u2029\x00"
    line = f'sepa_coap_bad_input_by_resource{{source="{label_value(forged)}"}} 1'
    assert line.splitlines() == [line]
    assert label_value('a "quoted" \\ value\n') == 'a \\"quoted\\" \\\\ value\\n'


def test_long_values_sharing_their_start_stay_apart() -> None:
    first, second = "t/" + "a" * 300 + "1", "t/" + "a" * 300 + "2"
    assert label_value(first) != label_value(second)
    assert len(label_value(first)) <= LABEL_CHARS and label_value("short") == "short"
