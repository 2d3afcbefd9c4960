"""Random readings for the property tests of batch writing (tests/observations, tests/shipper).

Several sensors and two properties, so batches move several latest nodes; values of every kind a
reading can hold; units or none; and keys drawn from a small set, so observation IRIs repeat
within a batch and across batches.
"""

from __future__ import annotations

from hypothesis import strategies as st

from gateway.observations import Reading

UNIT = "http://qudt.org/vocab/unit/"


def reading(
    sensor: int, value: float | int | bool | str, unit: str | None, key: str, prop: str = "temperature"
) -> Reading:
    return Reading(
        f"urn:example:sensor{sensor}",
        f"http://w3id.org/sepa-gateway/ns#{prop}",
        f"urn:example:room{sensor}",
        value,
        unit,
        f"home/sensor{sensor}/{prop}",
        None,
        key,
    )


values = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(min_value=-(10**15), max_value=10**15),
    st.booleans(),
    st.text(max_size=12),
)
readings = st.builds(
    reading,
    st.integers(0, 3),
    values,
    st.sampled_from([None, UNIT + "DEG_C", UNIT + "PERCENT"]),
    st.sampled_from(["k1", "k2", "k3", "k4", "k5", "k6"]),  # repeated keys: repeated observation IRIs
    st.sampled_from(["temperature", "humidity"]),
)
