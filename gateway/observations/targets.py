"""What a mapping's readings are about: sensor, feature of interest, observable property, unit.

Templates are checked when the mapping is compiled (an invalid static part is a MappingError);
filled templates are valid IRIs by construction, because captured text is percent-encoded.
A property is either an IRI template (`gw:temperature`, `http://example.org/p/{name}`) or a
*name* template (`temperature`, `{property}`) resolved through the known properties, which also
gives the default unit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.jsap.terms import TermError, expand_prefixed, iri_term
from gateway.observations.errors import MappingError, PayloadError
from gateway.observations.kinds import Kind, kind_named, kind_of, unit_named
from gateway.observations.sources import Template
from gateway.observations.vocabulary import GW, QUANTITY_KIND, QUDT, SOSA, UNIT, URN, XSD

PREFIXES = {"gw": GW, "sosa": SOSA, "qudt": QUDT, "unit": UNIT, "quantitykind": QUANTITY_KIND, "xsd": XSD}
PROPERTY_PREFIX = URN + "property:"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def iri_template(text: str, available: tuple[str, ...], what: str) -> Template:
    """An IRI template whose static text, with any capture values, is an absolute IRI."""
    expanded = expand_prefixed(text, PREFIXES)
    template = Template(expanded, available, what)
    sample = template.fill({name: "x" for name in (*available, "topic")})
    if not _SCHEME.match(sample):
        raise MappingError(f"{what} {text!r} is not an absolute IRI (write it in full, or gw:/unit:/sosa:...)")
    try:
        iri_term(sample)
    except TermError as error:
        raise MappingError(f"{what} {text!r}: {error}") from None
    return template


def unit_iri(text: str | None, what: str) -> str | None:
    """A unit symbol or IRI as a QUDT unit IRI; MappingError if it is neither known nor an IRI."""
    if text is None or text == "":
        return None
    known = unit_named(text)
    if known is not None:
        return known
    expanded = expand_prefixed(text, PREFIXES)
    if ":" in expanded and not expanded.startswith("unit:"):
        try:
            return iri_term(expanded).value
        except TermError as error:
            raise MappingError(f"{what} {text!r}: {error}") from None
    raise MappingError(f"{what} {text!r} is not a known unit symbol or an IRI")


class PropertyRef:
    """A property template: an IRI template or a name template resolved to a known property."""

    __slots__ = ("text", "_iri", "_name", "_fallback", "_static")

    def __init__(self, text: str, available: tuple[str, ...], what: str, fallback: str | None = None) -> None:
        if not text:
            raise MappingError(f"{what} is required")
        self.text = text
        expanded = expand_prefixed(text, PREFIXES)
        self._iri: Template | None = None
        self._name: Template | None = None
        self._fallback = None if fallback is None else iri_template(fallback, (*available, "name"), what)
        self._static: tuple[str, Kind | None] | None = None
        if ":" in expanded:
            self._iri = iri_template(text, available, what)
            if not self._iri.names:
                self._static = (self._iri.text, kind_of(self._iri.text))
        else:
            self._name = Template(text, available, what)
            if not self._name.names:
                kind = kind_named(text)
                if kind is None:
                    raise MappingError(f"{what} {text!r} is not a known property name (or write an IRI)")
                self._static = (kind.iri, kind)

    def resolve(self, values: Mapping[str, str]) -> tuple[str, Kind | None]:
        """(property IRI, known kind or None); PayloadError when a captured name is unknown."""
        if self._static is not None:
            return self._static
        if self._iri is not None:
            iri = self._iri.fill(values)
            return iri, kind_of(iri)
        assert self._name is not None
        name = self._name.fill(values, encoded=False)
        kind = kind_named(name)
        if kind is not None:
            return kind.iri, kind
        if self._fallback is not None:
            return self._fallback.fill({**values, "name": name}), None
        raise PayloadError(f"{name!r} is not a known property name")


@dataclass(frozen=True, slots=True)
class Resolved:
    """A mapping's targets for one topic (cached per topic by the Mapper)."""

    sensor: str
    feature: str
    property: str
    kind: Kind | None


class Targets:
    """Sensor, feature and property templates of one mapping, plus its explicit unit."""

    __slots__ = ("sensor", "feature", "property", "unit", "_per_reading")

    def __init__(
        self,
        sensor: str,
        feature: str,
        property_text: str | None,
        unit: str | None,
        available: tuple[str, ...],
        topic_names: tuple[str, ...],
        fallback: str | None = None,
    ) -> None:
        if not sensor:
            raise MappingError("'sensor' (an IRI template) is required")
        self.sensor = iri_template(sensor, available, "sensor")
        self.feature = iri_template(feature, available, "feature") if feature else self.sensor
        self.property = (
            PropertyRef(property_text, available, "property", fallback) if property_text is not None else None
        )
        self.unit = unit_iri(unit, "unit")
        # Names the topic cannot fill (a SenML record name...): the extractor fills those templates per reading.
        extra = set(available) - set(topic_names)
        self._per_reading = {template.text for template in (self.sensor, self.feature) if extra & set(template.names)}

    def resolve(self, captures: Mapping[str, str]) -> Resolved:
        """Fill the templates for one topic's captures (PayloadError for text no IRI can carry)."""
        try:
            sensor = "" if self.sensor.text in self._per_reading else self.sensor.fill(captures)
            feature = "" if self.feature.text in self._per_reading else self.feature.fill(captures)
            prop, kind = self.property.resolve(captures) if self.property is not None else ("", None)
        except UnicodeEncodeError:
            raise PayloadError("the topic contains text that is not valid Unicode") from None
        return Resolved(sensor, feature, prop, kind)
