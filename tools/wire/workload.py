"""What the wire benchmark sends and what it must get back: updates, subscriptions, expectations.

Why cycled with alternating values: the paper's U_LAMP profile is 310 updates that each set one
lamp to "100"; repeated as is, the second round would change nothing and notify no one. Round r
of the stream therefore sets :func:`round_value` (r), "100" on even rounds and "50" on odd ones,
so every update really changes its lamp (the knowledge base never holds "100", and consecutive
rounds differ) and each round produces the paper's 23 notifications on profile S.

Why matching by (alias, sequence): each subscription's notifications are numbered 1, 2, ... and
the lamps a subscription watches change exactly once per round, so notification t of a
subscription answers the t-th update of the stream that touches one of its lamps. Updates of the
same lamp are 310 apart in the stream, more than the concurrency allows in flight, so the gateway
applies them in stream order. The dimming value carried by the notification is checked too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pyoxigraph import Quad

from tools.lighting.knowledge_base import N_ROADS, lamp_uri, lamps_in_road, post_quads, road_quads, tbox_quads
from tools.lighting.profiles import (
    DIMMING_SET_BY_UPDATES,
    SubscriptionSpec,
    UpdateSpec,
    s_profile,
    u_lamp,
    u_lamp_profile,
)

ALTERNATE_DIMMING = "50"
MAX_CONCURRENCY = 256  # < 310 updates between two updates of one lamp: see the module docstring


def round_value(round_index: int) -> str:
    """The dimming value round `round_index` of the stream sets: "100", "50", "100", ..."""
    return DIMMING_SET_BY_UPDATES if round_index % 2 == 0 else ALTERNATE_DIMMING


@dataclass(frozen=True, slots=True)
class StreamUpdate:
    """Update k of the stream: which U_LAMP, which round, which value, the SPARQL text sent."""

    k: int
    spec: UpdateSpec
    round: int
    value: str
    sparql: str

    @property
    def lamp_iri(self) -> str:
        x, y = self.spec.lamps[0]
        return lamp_uri(x, y)


def update_stream(n: int) -> list[StreamUpdate]:
    """The first `n` updates of U_LAMP cycled round after round (identical for gateway and Oxigraph)."""
    profile = u_lamp_profile()
    stream = []
    for k in range(n):
        spec = profile[k % len(profile)]
        round_index = k // len(profile)
        value = round_value(round_index)
        x, y = spec.lamps[0]
        text = u_lamp(x, y)
        marker = f'"{DIMMING_SET_BY_UPDATES}"'
        assert text.count(marker) == 1, "U_LAMP text changed: adapt the value substitution"
        stream.append(StreamUpdate(k, spec, round_index, value, text.replace(marker, f'"{value}"')))
    return stream


def subscriptions() -> tuple[SubscriptionSpec, ...]:
    """Profile S of the paper: 1,000 S_LAMP and 4 S_ROAD; the alias of each is its name."""
    return s_profile()


def expected_notifications(
    stream: list[StreamUpdate], subs: tuple[SubscriptionSpec, ...]
) -> dict[tuple[str, int], int]:
    """(alias, sequence) -> index k of the update that notification must answer."""
    by_road: dict[int, list[SubscriptionSpec]] = {}
    for sub in subs:
        by_road.setdefault(sub.road, []).append(sub)
    sequence: dict[str, int] = {}
    expected: dict[tuple[str, int], int] = {}
    for update in stream:
        lamp = update.spec.lamps[0]
        for sub in by_road.get(lamp[0], ()):
            if sub.monitors(lamp):
                sequence[sub.name] = sequence.get(sub.name, 0) + 1
                expected[(sub.name, sequence[sub.name])] = update.k
    return expected


def kb_quads(lamps_per_road: int | None = None) -> Iterator[Quad]:
    """The lighting knowledge base, optionally capped at `lamps_per_road` lamp-posts per road.

    Why a cap: the end-to-end test needs a smaller store to stay fast. Lamp 1 of every road (the
    one U_LAMP updates) is always present, so the update stream and its notifications are the
    same; only the store's size and the S_ROAD results shrink, and S_LAMP subscriptions on capped
    lamps just stay empty.
    """
    yield from tbox_quads()
    for x in range(1, N_ROADS + 1):
        yield from road_quads(x)
        lamps = lamps_in_road(x) if lamps_per_road is None else min(lamps_in_road(x), lamps_per_road)
        for y in range(1, lamps + 1):
            yield from post_quads(x, y)
