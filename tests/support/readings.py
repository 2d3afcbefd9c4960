"""Fixtures of the observation layer, shared by its tests and the MQTT adapter's: a Mapper with the
ready-made profiles, and `read(topic, payload)` giving the readings of one message."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from adapters.mqtt.profiles import default_profiles
from gateway.observations import Mapper, Reading


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
