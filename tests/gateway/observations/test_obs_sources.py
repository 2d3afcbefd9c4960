"""Topic filters with captures and IRI templates.

What it protects: MQTT matching rules (+, #, $-topics), named captures, the subscription filters
handed to the broker, and that captured text from the network always lands in an IRI as a valid,
percent-encoded IRI part (hypothesis over arbitrary topic text).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.jsap.terms import iri_term
from gateway.observations import MappingError, PayloadError
from gateway.observations.sources import SourceFilter, Template, covers, uncovered


@pytest.mark.parametrize(
    ("filter_text", "topic", "expected"),
    [
        ("zigbee2mqtt/{device}", "zigbee2mqtt/kitchen", {"device": "kitchen"}),
        ("zigbee2mqtt/{device}", "zigbee2mqtt/kitchen/set", None),
        ("zigbee2mqtt/{device}", "zigbee2mqtt", None),
        ("zigbee2mqtt/{device}", "zigbee2mqtt/", None),
        ("homie/5/{d}/{n}/{p}", "homie/5/dev/node/temp", {"d": "dev", "n": "node", "p": "temp"}),
        ("a/+/c", "a/b/c", {}),
        ("a/#", "a", {}),
        ("a/#", "a/b/c", {}),
        ("a/{rest+}", "a/b/c", {"rest": "b/c"}),
        ("a/{rest+}", "a", None),
        ("#", "$SYS/broker/load", None),
        ("+/x", "$SYS/x", None),
        ("$SYS/#", "$SYS/broker", {}),
        ("tele/{device}/SENSOR", "tele/plug1/SENSOR", {"device": "plug1"}),
        ("tele/{device}/SENSOR", "tele/plug1/STATE", None),
    ],
)
def test_matching(filter_text: str, topic: str, expected: dict | None) -> None:
    assert SourceFilter(filter_text).match(topic) == expected


def test_subscription_replaces_captures_by_wildcards() -> None:
    assert SourceFilter("homie/5/{d}/{n}/{p}/$unit").subscription == "homie/5/+/+/+/$unit"
    assert SourceFilter("a/{rest+}").subscription == "a/#"


@pytest.mark.parametrize(
    ("filter_text", "message"),
    [
        ("", "empty"),
        ("a/#/b", "last level"),
        ("a/{x+}/b", "last level"),
        ("a/b+/c", "whole level"),
        ("a/{x}/{x}", "twice"),
        ("a/{topic}", "reserved"),
        ("a/x{y}", "whole level"),
    ],
)
def test_bad_filters(filter_text: str, message: str) -> None:
    with pytest.raises(MappingError, match=message):
        SourceFilter(filter_text)


def test_template_rejects_unknown_capture() -> None:
    with pytest.raises(MappingError, match="not one of"):
        Template("urn:x:{nope}", ("device",), "sensor")


levels = st.text(alphabet=st.characters(blacklist_characters="/+#", blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(levels, min_size=1, max_size=5))
def test_captures_always_make_valid_iris(parts: list[str]) -> None:
    topic = "dev/" + "/".join(parts)
    found = SourceFilter("dev/{rest+}").match(topic)
    if found is None:
        assert any(part == "" for part in parts)
        return
    assert found["rest"] == "/".join(parts)
    template = Template("urn:sepa-gateway:sensor:x/{rest}", ("rest",), "sensor")
    if any(part in (".", "..") for part in parts):  # would name another sensor once normalised
        with pytest.raises(PayloadError, match="segment"):
            template.fill(found)
        return
    iri = template.fill(found)
    assert iri_term(iri).value == iri  # validated by the same code that writes updates
    assert iri.startswith("urn:sepa-gateway:sensor:x/")


@pytest.mark.parametrize(
    ("outer", "inner", "expected"),
    [
        ("gateway/+/+", "gateway/boiler/temperature", True),
        ("gateway/boiler/temperature", "gateway/+/+", False),
        ("a/#", "a", True),  # '#' matches the parent level too
        ("a/#", "a/+/#", True),
        ("a/+", "a/#", False),
        ("a/+/c", "a/b/+", False),  # a partial overlap: neither covers the other
        ("#", "$SYS/broker", False),  # a wildcard first level matches no `$` topic
        ("$SYS/#", "$SYS/broker", True),
        ("a/b", "a/b/c", False),
    ],
)
def test_covers(outer: str, inner: str, expected: bool) -> None:
    assert covers(outer, inner) is expected


def test_uncovered_keeps_one_filter_per_message() -> None:
    filters = ["gateway/boiler/temperature", "homie/5/+/+/+", "gateway/+/+", "$share/g/gateway/x/y", "a/+/c", "a/b/+"]
    assert uncovered(filters) == ["homie/5/+/+/+", "gateway/+/+", "$share/g/gateway/x/y", "a/+/c", "a/b/+"]
