"""What an adapter extracted from one message, before it becomes an observation in the store."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Reading:
    """One value of one observable property measured by one sensor.

    `unit` is a QUDT unit IRI for numbers (None when the source does not say and the property has
    no default) and None for booleans and text. `key` makes the observation IRI unique when the
    payload carries no timestamp (`source_time_us` is None); see :func:`observation_iri`.
    `mapping` is the id of the mapping that read it ("" when none did): the latest view bounds
    the sensors one of a deployment's own mappings makes (ObservationWriter).
    """

    sensor: str
    property: str
    feature: str
    value: float | int | bool | str
    unit: str | None
    source: str
    source_time_us: int | None
    key: str
    mapping: str = ""
