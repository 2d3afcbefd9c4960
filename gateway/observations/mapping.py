"""Mappings: the declarative description of how a source's messages (a topic, a resource) become readings.

A Mapping comes from the config file (`[[mqtt.mappings]]`), from a ready-made profile, or from
RDF in the mappings graph (the Topics Manager). It is plain data; `compile_mapping` (in
:mod:`gateway.observations.compiler`) checks it and builds the code that reads payloads.

TOML shape (one table per mapping; `id`, `topic` and `extract` are required)::

    [[mqtt.mappings]]
    id = "boiler-flow"                       # unique; names the mapping in errors and in RDF
    topic = "plant/{room}/boiler/flow"       # source filter; {name} = one level, {name+} = the rest
    extract = "json"                         # number | boolean | json | regex | fields | senml | ignore,
                                             # and adapters' own (MQTT: tasmota | homie | homie-unit |
                                             # homie-description): gateway.observations.extractors
    path = "sensors[0].value"                # json: where the value is
    pattern = 'T=(?P<value>[-0-9.]+)'        # regex: a named group `value`
    true_words = ["on", "open"]              # boolean words (defaults: true/on/1/yes/open/...)
    false_words = ["off", "closed"]
    property = "temperature"                 # a known property name, or an IRI template (gw:..., http...)
    unit = "degC"                            # a unit symbol (degC, °C, Cel, hPa, kWh...) or unit:DEG_C / an IRI
    sensor = "urn:example:boiler/{room}"     # IRI template, required unless the extractor mints its own
    feature = "urn:example:room/{room}"      # IRI template; defaults to the sensor
    time_path = "ts"                         # JSON path of the source timestamp (default: time/Time/timestamp/ts)
    order = 0                                # lower first; config order breaks ties
    [[mqtt.mappings.fields]]                 # fields: one JSON object, several readings
    key = "temp"
    property = "temperature"
    unit = "degC"
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.observations.payloads import DEFAULT_FALSE_WORDS, DEFAULT_TRUE_WORDS


@dataclass(frozen=True, slots=True)
class FieldMap:
    """One key of a JSON object mapped to a property (and unit) by a `fields` mapping."""

    key: str
    property: str
    unit: str | None = None


@dataclass(frozen=True)
class Mapping:
    """One topic mapping; templates may use the filter's captures and `{topic}`."""

    id: str
    topic: str
    extract: str
    sensor: str = ""
    property: str = ""
    feature: str = ""
    unit: str | None = None
    path: str | None = None
    pattern: str | None = None
    true_words: tuple[str, ...] = DEFAULT_TRUE_WORDS
    false_words: tuple[str, ...] = DEFAULT_FALSE_WORDS
    fields: tuple[FieldMap, ...] = ()
    time_path: str | None = None
    order: int = 0
