"""The observable properties and units the gateway knows by name.

Sensor ecosystems name the same thing differently (`temperature`, `Temperature`, `temp`, SenML
`Cel`, Homie `°C`); this table turns those names into the gateway's observable properties
(gw:temperature...) and QUDT unit IRIs, so applications query by meaning. It mirrors
ontologies/gateway.ttl (a test keeps them equal). Names are looked up normalised: case, `_`, `-`
and spaces are ignored, so `soil_moisture`, `soilMoisture` and `Soil-Moisture` are one name.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.observations.vocabulary import GW, QUANTITY_KIND, UNIT


@dataclass(frozen=True, slots=True)
class Kind:
    """An observable property: its IRI, QUDT quantity kind, and the unit a bare number is in."""

    name: str
    iri: str
    quantity_kind: str | None
    default_unit: str | None
    boolean: bool = False


def _number(name: str, quantity_kind: str, unit: str) -> Kind:
    return Kind(name, GW + name, QUANTITY_KIND + quantity_kind, UNIT + unit)


def _flag(name: str) -> Kind:
    return Kind(name, GW + name, None, None, boolean=True)


KINDS: tuple[Kind, ...] = (
    _number("temperature", "Temperature", "DEG_C"),
    _number("dewPoint", "Temperature", "DEG_C"),
    _number("relativeHumidity", "RelativeHumidity", "PERCENT_RH"),
    _number("pressure", "Pressure", "HectoPA"),
    _number("illuminance", "Illuminance", "LUX"),
    _number("co2Concentration", "MoleFraction", "PPM"),
    _number("voltage", "Voltage", "V"),
    _number("current", "ElectricCurrent", "A"),
    _number("power", "Power", "W"),
    _number("energy", "Energy", "KiloW-HR"),
    _number("dimmingLevel", "DimensionlessRatio", "PERCENT"),
    _number("soilMoisture", "DimensionlessRatio", "PERCENT"),
    _number("batteryLevel", "DimensionlessRatio", "PERCENT"),
    _number("count", "Count", "NUM"),
    _flag("presence"),
    _flag("occupancy"),
    _flag("contact"),
    _flag("motion"),
    _flag("waterLeak"),
    _flag("onOff"),
)

# Extra names found in the wild for the same properties (normalised when looked up).
_KIND_ALIASES = {
    "temp": "temperature",
    "humidity": "relativeHumidity",
    "rh": "relativeHumidity",
    "illuminance_lux": "illuminance",
    "lux": "illuminance",
    "co2": "co2Concentration",
    "carbondioxide": "co2Concentration",
    "eco2": "co2Concentration",
    "total": "energy",
    "dimming": "dimmingLevel",
    "level": "dimmingLevel",
    "battery": "batteryLevel",
    "counter": "count",
    "water_leak": "waterLeak",
    "state": "onOff",
    "power_state": "onOff",
}

_UNIT_ALIASES: dict[str, tuple[str, ...]] = {
    "DEG_C": ("degC", "°C", "C", "Cel", "celsius"),
    "DEG_F": ("degF", "°F", "F", "fahrenheit"),
    "K": ("K", "kelvin"),
    "PERCENT_RH": ("%RH", "RH"),
    "PERCENT": ("%", "percent", "%EL"),
    "PA": ("Pa", "pascal"),
    "HectoPA": ("hPa",),
    "KiloPA": ("kPa",),
    "BAR": ("bar",),
    "MilliBAR": ("mbar",),
    "LUX": ("lx", "lux"),
    "PPM": ("ppm",),
    "V": ("V", "volt"),
    "MilliV": ("mV",),
    "A": ("A", "ampere"),
    "MilliA": ("mA",),
    "W": ("W", "watt"),
    "KiloW": ("kW",),
    "W-HR": ("Wh",),
    "KiloW-HR": ("kWh",),
    "NUM": ("count", "#"),
}

# SenML units that say which property a nameless record measures.
_UNIT_KINDS = {
    "DEG_C": "temperature",
    "DEG_F": "temperature",
    "K": "temperature",
    "PERCENT_RH": "relativeHumidity",
    "PA": "pressure",
    "HectoPA": "pressure",
    "KiloPA": "pressure",
    "BAR": "pressure",
    "MilliBAR": "pressure",
    "LUX": "illuminance",
    "PPM": "co2Concentration",
    "V": "voltage",
    "MilliV": "voltage",
    "A": "current",
    "MilliA": "current",
    "W": "power",
    "KiloW": "power",
    "W-HR": "energy",
    "KiloW-HR": "energy",
    "NUM": "count",
}


def normalise(name: str) -> str:
    """The lookup form of a name: lower case without `_`, `-` or spaces."""
    return name.lower().replace("_", "").replace("-", "").replace(" ", "")


_BY_NAME: dict[str, Kind] = {normalise(kind.name): kind for kind in KINDS}
_BY_NAME.update({normalise(alias): _BY_NAME[normalise(target)] for alias, target in _KIND_ALIASES.items()})
_BY_IRI: dict[str, Kind] = {kind.iri: kind for kind in KINDS}
UNITS: frozenset[str] = frozenset(UNIT + local for local in _UNIT_ALIASES)
# Unit symbols are case-sensitive (mV is not MV), so they are matched exactly first; then without
# case ("CELSIUS", "KWH"), except milli ones: MV and MA are mega units, and were stored as mV and mA
# (a factor of 10^9, from any sensor naming its unit so).
_UNIT_EXACT: dict[str, str] = {alias: UNIT + local for local, aliases in _UNIT_ALIASES.items() for alias in aliases}
_UNIT_FOLDED: dict[str, str] = {}
for _alias, _iri in _UNIT_EXACT.items():
    if not _iri.removeprefix(UNIT).startswith("Milli"):
        _UNIT_FOLDED.setdefault(_alias.lower(), _iri)


def kind_named(name: str) -> Kind | None:
    """The observable property a name stands for (`temperature`, `Humidity`, `soil_moisture`), if known."""
    return _BY_NAME.get(normalise(name))


def kind_of(iri: str) -> Kind | None:
    """The known observable property with this IRI, if it is one of the gateway's."""
    return _BY_IRI.get(iri)


def unit_named(symbol: str) -> str | None:
    """The QUDT unit IRI for a unit symbol (`°C`, `Cel`, `kWh`, `unit:DEG_C`), or None if unknown."""
    symbol = symbol.strip()
    if symbol.startswith("unit:"):
        iri = UNIT + symbol[5:]
        return iri if iri in UNITS else None
    if symbol.startswith(UNIT):
        return symbol if symbol in UNITS else None
    return _UNIT_EXACT.get(symbol) or _UNIT_FOLDED.get(symbol.lower())


def kind_for_unit(unit: str) -> Kind | None:
    """The property a number in this unit most likely measures (for SenML records named only by unit)."""
    name = _UNIT_KINDS.get(unit.removeprefix(UNIT)) if unit.startswith(UNIT) else None
    return kind_named(name) if name else None
