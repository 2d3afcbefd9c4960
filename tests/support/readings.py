"""Fixtures of the observation layer, shared by its tests and the MQTT adapter's: a Mapper with the
ready-made profiles, and `read(topic, payload)` giving the readings of one message; and a mapping
whose pattern backtracks exponentially, with a payload that makes it (both adapters' tests)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from adapters.mqtt.profiles import default_profiles
from gateway.observations import Mapper, Reading

# `evil/{sensor}` read by `^(a|aa)+$`: the payload below costs the pattern ~6 s unlimited (the
# `regex` module, 2026-12-07), against a limit of 50 ms (gateway.observations.extractors)
CATASTROPHIC_MAPPING = (
    "PREFIX gw: <http://w3id.org/sepa-gateway/ns#> "
    "INSERT DATA { GRAPH <http://w3id.org/sepa-gateway/graph/mappings> { "
    '<urn:sepa-gateway:mapping:evil> a gw:TopicMapping ; gw:mappingId "evil" ; '
    'gw:topicFilter "evil/{sensor}" ; gw:extract "regex" ; gw:pattern "^(?P<value>(a|aa)+)$" ; '
    'gw:sensorTemplate "urn:example:{sensor}" ; gw:propertyTemplate "temperature" } }'
)
CATASTROPHIC_PAYLOAD = "a" * 34 + "!"


@pytest.fixture
def mapper() -> Mapper:
    return Mapper(default_profiles())


@pytest.fixture
def read(mapper: Mapper) -> Callable[..., list[Reading]]:
    counter = iter(range(1, 10**9))

    def read(topic: str, payload: str | bytes) -> list[Reading]:
        data = payload.encode() if isinstance(payload, str) else payload
        return mapper.readings(topic, data, 1_800_000_000_000_000 + next(counter))

    return read
