"""Update and subscription profiles of the lighting benchmark (seed 001, Tables III, V, VI, VII).

Why the updates are not copied verbatim: Table III writes ``INSERT {..} DELETE {..} WHERE {..}``,
which is not SPARQL 1.1; here DELETE comes before INSERT, everything else (the triple patterns and
the ``FILTER(?road = ROAD_URI_X)`` form, which engines must not special-case) is the paper's.

Why subscriptions are indexed 1..1004 in order rather than by the paper's ``j`` formulas: those
formulas overlap (medium roads would give j = 201..350, large roads j = 301..1000) although
Table V's counts (50 + 100 + 150 + 700 = 1,000 S_LAMP) are unambiguous. The *set* of
(road, lamp) pairs is exactly the formula's; only the numbering differs.

Besides the SPARQL texts, each update and subscription carries the lamps it touches / monitors, so
the paper's expected figures (Nu vector, LUTT matrix, LHR, notification count) can be derived from
the profile alone and compared with what an engine measures.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from tools.lighting.knowledge_base import N_ROADS, NS, initial_dimming, lamp_uri, lamps_in_road, road_uri

PREFIX = f"PREFIX ns: <{NS}>\n"
DIMMING_SET_BY_UPDATES = "100"
EXPERIMENTS = ("LAMP", "ROAD")

Lamp = tuple[int, int]

# Table V / §V-B: fine-grain subscriptions per (roads, lamps per road), coarse-grain roads.
S_LAMP_BLOCKS: tuple[tuple[range, int], ...] = (
    (range(1, 6), 10),
    (range(101, 105), 25),
    (range(201, 204), 50),
    (range(301, 308), 100),
)
S_ROAD_ROADS: tuple[int, ...] = (6, 105, 204, 308)


# -- SPARQL texts (Table III) ----------------------------------------------------------------------

_ROAD_PATTERN = (
    "?lamp ns:hasDimmingValue ?dimming . ?post ns:hasLamp ?lamp . ?road ns:isConnectedTo ?post . "
    "FILTER(?road = <{road}>)"
)


def u_lamp(x: int, y: int) -> str:
    """U_LAMP(X, Y): set the dimming of lamp Y of road X to "100"."""
    lamp = lamp_uri(x, y)
    return (
        f"{PREFIX}DELETE {{ <{lamp}> ns:hasDimmingValue ?dimming }}\n"
        f'INSERT {{ <{lamp}> ns:hasDimmingValue "{DIMMING_SET_BY_UPDATES}" }}\n'
        f"WHERE {{ <{lamp}> ns:hasDimmingValue ?dimming }}"
    )


def u_road(x: int) -> str:
    """U_ROAD(X): set the dimming of every lamp of road X to "100"."""
    return (
        f"{PREFIX}DELETE {{ ?lamp ns:hasDimmingValue ?dimming }}\n"
        f'INSERT {{ ?lamp ns:hasDimmingValue "{DIMMING_SET_BY_UPDATES}" }}\n'
        f"WHERE {{ {_ROAD_PATTERN.format(road=road_uri(x))} }}"
    )


def s_lamp(x: int, y: int) -> str:
    """S_LAMP(X, Y), fine-grain: the dimming value of lamp Y of road X."""
    return f"{PREFIX}SELECT ?dimming WHERE {{ <{lamp_uri(x, y)}> ns:hasDimmingValue ?dimming }}"


def s_road(x: int) -> str:
    """S_ROAD(X), coarse-grain: every lamp of road X with its dimming value."""
    return f"{PREFIX}SELECT ?lamp ?dimming WHERE {{ {_ROAD_PATTERN.format(road=road_uri(x))} }}"


# -- profile entries -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UpdateSpec:
    """One U_i: its text and the lamps whose dimming it sets (Nu_i = how many, Table VI)."""

    index: int
    name: str
    sparql: str
    lamps: tuple[Lamp, ...]

    @property
    def nu(self) -> int:
        return len(self.lamps)


@dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    """One S_j: its text and what it watches (one lamp, or all lamps of `road` when lamp is None)."""

    index: int
    name: str
    sparql: str
    road: int
    lamp: int | None = None

    def monitors(self, lamp: Lamp) -> bool:
        """Whether a change of `lamp`'s dimming changes this subscription's result."""
        return lamp[0] == self.road and (self.lamp is None or lamp[1] == self.lamp)

    def lutt_hit(self, update: UpdateSpec) -> bool:
        """h_ij of Table VII: does any triple of U_i pass this subscription's LUTT?

        A coarse-grain LUTT holds ``* ns:hasDimmingValue *`` (Table IV), so every dimming change
        passes it; a fine-grain one only its own lamp's.
        """
        return self.lamp is None or any(self.monitors(lamp) for lamp in update.lamps)


def update_lamp(x: int, y: int, index: int) -> UpdateSpec:
    return UpdateSpec(index, f"U_LAMP({x},{y})", u_lamp(x, y), ((x, y),))


def update_road(x: int, index: int) -> UpdateSpec:
    lamps = tuple((x, y) for y in range(1, lamps_in_road(x) + 1))
    return UpdateSpec(index, f"U_ROAD({x})", u_road(x), lamps)


def subscription_lamp(x: int, y: int, index: int) -> SubscriptionSpec:
    return SubscriptionSpec(index, f"S_LAMP({x},{y})", s_lamp(x, y), x, y)


def subscription_road(x: int, index: int) -> SubscriptionSpec:
    return SubscriptionSpec(index, f"S_ROAD({x})", s_road(x), x)


def u_lamp_profile() -> tuple[UpdateSpec, ...]:
    """U_LAMP = {U_LAMP(i, 1) | i in 1..310}: one lamp per road."""
    return tuple(update_lamp(i, 1, i) for i in range(1, N_ROADS + 1))


def u_road_profile() -> tuple[UpdateSpec, ...]:
    """U_ROAD = {U_ROAD(i) | i in 1..310}: every lamp of every road, road by road."""
    return tuple(update_road(i, i) for i in range(1, N_ROADS + 1))


def s_profile() -> tuple[SubscriptionSpec, ...]:
    """S (Table V): 1,000 fine-grain S_LAMP then 4 coarse-grain S_ROAD, m = 1,004."""
    pairs = [(x, y) for roads, lamps in S_LAMP_BLOCKS for x in roads for y in range(1, lamps + 1)]
    subs = [subscription_lamp(x, y, j) for j, (x, y) in enumerate(pairs, start=1)]
    subs += [subscription_road(x, len(pairs) + k) for k, x in enumerate(S_ROAD_ROADS, start=1)]
    return tuple(subs)


def all_subscribed_profile() -> tuple[SubscriptionSpec, ...]:
    """Variant: every lamp (9,500 S_LAMP) and every road (310 S_ROAD) subscribed, m = 9,810."""
    subs = [subscription_lamp(x, y, 0) for x in range(1, N_ROADS + 1) for y in range(1, lamps_in_road(x) + 1)]
    subs += [subscription_road(x, 0) for x in range(1, N_ROADS + 1)]
    return tuple(SubscriptionSpec(j, s.name, s.sparql, s.road, s.lamp) for j, s in enumerate(subs, start=1))


# -- experiments and their expected figures --------------------------------------------------------


@dataclass(frozen=True)
class Experiment:
    """One experiment of §V-B: an update profile against a subscription profile on a fresh store."""

    name: str
    updates: tuple[UpdateSpec, ...]
    subscriptions: tuple[SubscriptionSpec, ...]

    @property
    def n(self) -> int:
        return len(self.updates)

    @property
    def m(self) -> int:
        return len(self.subscriptions)

    @property
    def nu_avg(self) -> float:
        """Nu_AVG of (4): mean number of dimming triples per update (1 for LAMP, 30.6 for ROAD)."""
        return sum(u.nu for u in self.updates) / self.n

    @cached_property
    def lutt_hits(self) -> int:
        """Sum of the LUTT matrix h (Table VII), counted without building the n x m matrix."""
        coarse = sum(1 for s in self.subscriptions if s.lamp is None)
        fine: dict[Lamp, int] = {}
        for s in self.subscriptions:
            if s.lamp is not None:
                fine[(s.road, s.lamp)] = fine.get((s.road, s.lamp), 0) + 1
        hits = 0
        for u in self.updates:
            if u.lamps:
                hits += coarse
            hits += sum(fine.get(lamp, 0) for lamp in u.lamps)
        return hits

    @property
    def lhr_percent(self) -> float:
        """LHR of (5): 0.40 % for LAMP, 0.72 % for ROAD."""
        return 100.0 * self.lutt_hits / (self.n * self.m)

    @cached_property
    def notified(self) -> tuple[tuple[int, ...], ...]:
        """For each update, the indices j of the subscriptions whose result it changes.

        Simulates the dimming values: an update changes only lamps not already at "100".
        """
        dimming: dict[Lamp, str] = {}
        by_road: dict[int, list[SubscriptionSpec]] = {}
        for s in self.subscriptions:
            by_road.setdefault(s.road, []).append(s)
        out = []
        for u in self.updates:
            changed = [lamp for lamp in u.lamps if dimming.get(lamp, initial_dimming(*lamp)) != DIMMING_SET_BY_UPDATES]
            for lamp in changed:
                dimming[lamp] = DIMMING_SET_BY_UPDATES
            hit = {s.index for lamp in changed for s in by_road.get(lamp[0], ()) if s.monitors(lamp)}
            out.append(tuple(sorted(hit)))
        return tuple(out)

    @property
    def expected_notifications(self) -> int:
        """Notifications after the sequence-0 replies: 23 for LAMP, 1,004 for ROAD."""
        return sum(len(js) for js in self.notified)


def experiment(name: str, *, all_subscribed: bool = False) -> Experiment:
    """The LAMP or ROAD experiment with the S profile (or the every-lamp-and-road variant)."""
    updates = {"LAMP": u_lamp_profile, "ROAD": u_road_profile}
    if name not in updates:
        raise ValueError(f"unknown experiment {name!r}; expected one of {', '.join(EXPERIMENTS)}")
    subs = all_subscribed_profile() if all_subscribed else s_profile()
    return Experiment(name, updates[name](), subs)
