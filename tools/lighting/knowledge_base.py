"""The smart-city lighting knowledge base of seed 001 (§V-A, Table II), generated deterministically.

Why generated and not shipped: the store holds ~334k triples; generating them costs about a
second, keeps the repository small and lets every experiment start from an identical, fresh store.

Shape (Table II): 310 roads -- roads 1..100 have 10 lamp-posts, 101..200 have 25, 201..300 have 50
and 301..310 have 100 -- so 9,500 posts and 19,000 sensors. Every post carries exactly
:data:`TRIPLES_PER_POST` (35) triples, the figure Table II implies (35K triples per 1K posts), and
the T-box has Table II's 27 classes, 26 individuals, 16 object and 8 datatype properties (251
triples). With 3 triples per road the total is 333,681, i.e. the paper's "334K".

URIs follow the paper's ROAD_URI_X / LAMP_URI_X_Y scheme as ``ns:Road_X`` and ``ns:Lamp_X_Y``.
Dimming values are plain literals ("0".."90", never "100") so that every U_LAMP / U_ROAD update of
the benchmark really changes the lamps it touches, which is what gives the paper's notification
counts (Table VIII: LAMP 23, ROAD 1,004).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pyoxigraph import DefaultGraph, Literal, NamedNode, Quad

NS = "http://sepa-gateway.example/ontology/lighting#"
"""The benchmark vocabulary; queries and updates bind it to the ``ns:`` prefix as the paper does."""

RDF_TYPE = NamedNode("http://www.w3.org/1999/02/22-rdf-syntax-ns#type")
RDFS_LABEL = NamedNode("http://www.w3.org/2000/01/rdf-schema#label")
RDFS_SUBCLASS = NamedNode("http://www.w3.org/2000/01/rdf-schema#subClassOf")
RDFS_DOMAIN = NamedNode("http://www.w3.org/2000/01/rdf-schema#domain")
RDFS_RANGE = NamedNode("http://www.w3.org/2000/01/rdf-schema#range")
OWL = "http://www.w3.org/2002/07/owl#"
XSD = "http://www.w3.org/2001/XMLSchema#"
XSD_DECIMAL = NamedNode(XSD + "decimal")
XSD_LONG = NamedNode(XSD + "long")


@dataclass(frozen=True, slots=True)
class RoadType:
    """One row of Table II: roads [first_road, first_road + roads) each have `lamps` lamp-posts."""

    name: str
    lamps: int
    first_road: int
    roads: int
    paper_triples: int

    @property
    def last_road(self) -> int:
        return self.first_road + self.roads - 1

    @property
    def posts(self) -> int:
        return self.lamps * self.roads


ROAD_TYPES: tuple[RoadType, ...] = (
    RoadType("VerySmallRoad", 10, 1, 100, 35_000),
    RoadType("SmallRoad", 25, 101, 100, 88_000),
    RoadType("MediumRoad", 50, 201, 100, 175_000),
    RoadType("LargeRoad", 100, 301, 10, 35_000),
)
N_ROADS = sum(t.roads for t in ROAD_TYPES)  # 310
N_POSTS = sum(t.posts for t in ROAD_TYPES)  # 9,500
N_SENSORS = 2 * N_POSTS  # 19,000
TRIPLES_PER_POST = 35
TRIPLES_PER_ROAD = 3
PAPER_TOTAL_TRIPLES = 334_000
PAPER_TOTAL_POSTS = 9_500

# -- T-box: the names are ours, the sizes are Table II's -------------------------------------------

CLASSES: tuple[tuple[str, str | None], ...] = (
    ("PhysicalObject", None),
    ("Infrastructure", "PhysicalObject"),
    ("GeographicalFeature", None),
    ("City", "GeographicalFeature"),
    ("District", "GeographicalFeature"),
    ("Road", "Infrastructure"),
    ("VerySmallRoad", "Road"),
    ("SmallRoad", "Road"),
    ("MediumRoad", "Road"),
    ("LargeRoad", "Road"),
    ("LightingSystem", "Infrastructure"),
    ("LampPost", "Infrastructure"),
    ("GeoPosition", None),
    ("Device", "PhysicalObject"),
    ("Lamp", "Device"),
    ("Sensor", "Device"),
    ("TemperatureSensor", "Sensor"),
    ("PresenceSensor", "Sensor"),
    ("Observation", None),
    ("TemperatureMeasure", "Observation"),
    ("PresenceMeasure", "Observation"),
    ("Enumeration", None),
    ("LampStatus", "Enumeration"),
    ("LampType", "Enumeration"),
    ("SensorType", "Enumeration"),
    ("UnitOfMeasure", "Enumeration"),
    ("ControlCenter", "Infrastructure"),
)
INDIVIDUALS: tuple[tuple[str, str], ...] = (
    ("ON", "LampStatus"),
    ("OFF", "LampStatus"),
    ("BROKEN", "LampStatus"),
    ("LED", "LampType"),
    ("TRADITIONAL", "LampType"),
    ("TEMPERATURE", "SensorType"),
    ("PRESENCE", "SensorType"),
    ("CELSIUS", "UnitOfMeasure"),
    ("FAHRENHEIT", "UnitOfMeasure"),
    ("BOOLEAN", "UnitOfMeasure"),
    ("CITY", "City"),
    ("LIGHTING_SYSTEM", "LightingSystem"),
    ("CONTROL_CENTER", "ControlCenter"),
    *((f"DISTRICT_{i}", "District") for i in range(1, 14)),
)
OBJECT_PROPERTIES: tuple[tuple[str, str, str], ...] = (
    ("isConnectedTo", "Road", "LampPost"),
    ("hasLamp", "LampPost", "Lamp"),
    ("hasPosition", "LampPost", "GeoPosition"),
    ("hasTemperatureSensor", "LampPost", "TemperatureSensor"),
    ("hasPresenceSensor", "LampPost", "PresenceSensor"),
    ("hasStatus", "Lamp", "LampStatus"),
    ("hasLampType", "Lamp", "LampType"),
    ("hasSensorType", "Sensor", "SensorType"),
    ("isMountedOn", "Sensor", "LampPost"),
    ("hasMeasure", "Sensor", "Observation"),
    ("hasUnitOfMeasure", "Observation", "UnitOfMeasure"),
    ("belongsToCity", "Road", "City"),
    ("isInDistrict", "Road", "District"),
    ("isPartOf", "LampPost", "LightingSystem"),
    ("isManagedBy", "LightingSystem", "ControlCenter"),
    ("isMeasureOf", "Observation", "Sensor"),
)
DATATYPE_PROPERTIES: tuple[tuple[str, str, str], ...] = (
    ("hasDimmingValue", "Lamp", XSD + "string"),
    ("hasLatitude", "GeoPosition", XSD + "decimal"),
    ("hasLongitude", "GeoPosition", XSD + "decimal"),
    ("hasValue", "Observation", XSD + "string"),
    ("hasTimestamp", "Observation", XSD + "long"),
    ("hasName", "Road", XSD + "string"),
    ("hasLampPostCount", "Road", XSD + "integer"),
    ("hasInstallationYear", "Lamp", XSD + "integer"),
)


def ns(local: str) -> NamedNode:
    """A term of the benchmark vocabulary."""
    return NamedNode(NS + local)


def road_uri(x: int) -> str:
    """ROAD_URI_X of the paper."""
    return f"{NS}Road_{x}"


def lamp_uri(x: int, y: int) -> str:
    """LAMP_URI_X_Y of the paper: lamp Y (1-based) of road X."""
    return f"{NS}Lamp_{x}_{y}"


def road_type(x: int) -> RoadType:
    """The Table II row road X belongs to."""
    for kind in ROAD_TYPES:
        if kind.first_road <= x <= kind.last_road:
            return kind
    raise ValueError(f"road {x} is outside 1..{N_ROADS}")


def lamps_in_road(x: int) -> int:
    """N_LAMP of road X (10, 25, 50 or 100)."""
    return road_type(x).lamps


def initial_dimming(x: int, y: int) -> str:
    """Initial dimming of lamp (X, Y): a multiple of 10 in 0..90, never the "100" the updates set."""
    return str(10 * ((3 * x + 7 * y) % 10))


def lamp_status(x: int, y: int) -> str:
    """ON / OFF / BROKEN, spread deterministically (the benchmark never reads it)."""
    code = (7 * x + y) % 20
    return "BROKEN" if code == 0 else "OFF" if code % 4 == 0 else "ON"


# -- quads -----------------------------------------------------------------------------------------

_G = DefaultGraph()
_P = {name: ns(name) for name, _, _ in OBJECT_PROPERTIES + DATATYPE_PROPERTIES}
_C = {name: ns(name) for name, _ in CLASSES}
_I = {name: ns(name) for name, _ in INDIVIDUALS}
_CITY = _I["CITY"]
TIMESTAMP_BASE_US = 1_450_000_000_000_000  # unix time in microseconds (paper: "extended to µs")


def _q(s: NamedNode, p: NamedNode, o: NamedNode | Literal) -> Quad:
    return Quad(s, p, o, _G)


def tbox_quads() -> Iterator[Quad]:
    """The ontology: classes, individuals, object and datatype properties (Table II T-box)."""
    owl_class, owl_ind = NamedNode(OWL + "Class"), NamedNode(OWL + "NamedIndividual")
    yield _q(NamedNode(NS.rstrip("#")), RDF_TYPE, NamedNode(OWL + "Ontology"))
    for name, parent in CLASSES:
        yield _q(_C[name], RDF_TYPE, owl_class)
        yield _q(_C[name], RDFS_LABEL, Literal(name))
        if parent is not None:
            yield _q(_C[name], RDFS_SUBCLASS, _C[parent])
    for name, cls in INDIVIDUALS:
        yield _q(_I[name], RDF_TYPE, owl_ind)
        yield _q(_I[name], RDF_TYPE, _C[cls])
        yield _q(_I[name], RDFS_LABEL, Literal(name))
    for kind, props in (("ObjectProperty", OBJECT_PROPERTIES), ("DatatypeProperty", DATATYPE_PROPERTIES)):
        for name, domain, rng in props:
            yield _q(_P[name], RDF_TYPE, NamedNode(OWL + kind))
            yield _q(_P[name], RDFS_DOMAIN, _C[domain])
            yield _q(_P[name], RDFS_RANGE, _C[rng] if rng in _C else NamedNode(rng))
            yield _q(_P[name], RDFS_LABEL, Literal(name))


def road_quads(x: int) -> list[Quad]:
    """The TRIPLES_PER_ROAD triples describing road X itself (its posts come from post_quads)."""
    road = NamedNode(road_uri(x))
    return [
        _q(road, RDF_TYPE, _C[road_type(x).name]),
        _q(road, _P["hasName"], Literal(f"Road {x}")),
        _q(road, _P["belongsToCity"], _CITY),
    ]


def post_quads(x: int, y: int) -> list[Quad]:
    """The TRIPLES_PER_POST (35) triples of lamp-post Y of road X, its lamp and its two sensors.

    Includes the road's ns:isConnectedTo link, because S_ROAD and U_ROAD reach lamps through it.
    """
    p = _P
    key = f"{x}_{y}"
    post, lamp, pos = ns(f"Post_{key}"), NamedNode(lamp_uri(x, y)), ns(f"Position_{key}")
    lat = Literal(f"{44.45 + (x % 31) * 0.003 + y * 0.00002:.6f}", datatype=XSD_DECIMAL)
    lon = Literal(f"{11.30 + (x // 31) * 0.004 + y * 0.00003:.6f}", datatype=XSD_DECIMAL)
    quads = [
        _q(NamedNode(road_uri(x)), p["isConnectedTo"], post),
        _q(post, RDF_TYPE, _C["LampPost"]),
        _q(post, RDFS_LABEL, Literal(f"Lamp-post {key}")),
        _q(post, p["hasLamp"], lamp),
        _q(post, p["hasPosition"], pos),
        _q(pos, RDF_TYPE, _C["GeoPosition"]),
        _q(pos, p["hasLatitude"], lat),
        _q(pos, p["hasLongitude"], lon),
        _q(lamp, RDF_TYPE, _C["Lamp"]),
        _q(lamp, RDFS_LABEL, Literal(f"Lamp {key}")),
        _q(lamp, p["hasStatus"], _I[lamp_status(x, y)]),
        _q(lamp, p["hasDimmingValue"], Literal(initial_dimming(x, y))),
        _q(lamp, p["hasLampType"], _I["LED" if (x + y) % 3 else "TRADITIONAL"]),
    ]
    timestamp = Literal(str(TIMESTAMP_BASE_US + (x * 1000 + y) * 1_000_003), datatype=XSD_LONG)
    fahrenheit = x % 10 == 0
    sensors = (
        (
            "Temperature",
            "TEMPERATURE",
            "FAHRENHEIT" if fahrenheit else "CELSIUS",
            str((x + 3 * y) % 35 + (32 if fahrenheit else 0)),
        ),
        ("Presence", "PRESENCE", "BOOLEAN", "True" if (x * y) % 4 == 0 else "False"),
    )
    for kind, sensor_type, unit, value in sensors:
        sensor, measure = ns(f"{kind}Sensor_{key}"), ns(f"{kind}Measure_{key}")
        quads += [
            _q(post, p[f"has{kind}Sensor"], sensor),
            _q(sensor, RDF_TYPE, _C[f"{kind}Sensor"]),
            _q(sensor, RDFS_LABEL, Literal(f"{kind} sensor {key}")),
            _q(sensor, p["hasSensorType"], _I[sensor_type]),
            _q(sensor, p["isMountedOn"], post),
            _q(sensor, p["hasMeasure"], measure),
            _q(measure, RDF_TYPE, _C[f"{kind}Measure"]),
            _q(measure, p["hasValue"], Literal(value)),
            _q(measure, p["hasTimestamp"], timestamp),
            _q(measure, p["hasUnitOfMeasure"], _I[unit]),
            _q(measure, p["isMeasureOf"], sensor),
        ]
    return quads


def iter_quads() -> Iterator[Quad]:
    """Every quad of the knowledge base, in a fixed order, without holding them all in memory.

    Feed it to ``store.bulk_extend`` (or ``extend``): much faster than SPARQL INSERT DATA.
    """
    yield from tbox_quads()
    for x in range(1, N_ROADS + 1):
        yield from road_quads(x)
        for y in range(1, lamps_in_road(x) + 1):
            yield from post_quads(x, y)


def expected_triple_count() -> int:
    """The size of :func:`iter_quads` computed without generating it."""
    return sum(1 for _ in tbox_quads()) + N_ROADS * TRIPLES_PER_ROAD + N_POSTS * TRIPLES_PER_POST
