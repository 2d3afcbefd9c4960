"""The Mapper: from (topic, payload) to readings, with every mapping compiled once.

Matching is first-match in mapping order (`order`, then declaration order). Topics repeat (a
sensor publishes on the same topic for years), so the match and the filled IRIs are cached per
topic in a bounded dict: the per-message cost is a dict lookup plus the extractor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gateway.observations.compiler import compile_mapping
from gateway.observations.errors import MappingError, PayloadError, UnmappedTopic
from gateway.observations.extractors import Compiled, Message
from gateway.observations.learned_units import LearnedUnits
from gateway.observations.mapping import Mapping
from gateway.observations.reading import Reading
from gateway.observations.sources import uncovered
from gateway.observations.targets import Resolved

TOPIC_CACHE_SIZE = 16_384
_NO_TARGETS = Resolved("", "", "", None)
# Bugs in an extractor must not stop ingestion: they are reported like a bad payload.
_EXTRACTOR_FAULTS = (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError, OverflowError)


class Mapper:
    """Compiled mappings plus the small state some ecosystems need (Homie units per topic)."""

    def __init__(
        self,
        mappings: Iterable[Mapping],
        *,
        max_payload_bytes: int = 65_536,
        units: LearnedUnits | None = None,
    ) -> None:
        ordered = sorted(enumerate(mappings), key=lambda item: (item[1].order, item[0]))
        self.mappings: list[Mapping] = [mapping for _, mapping in ordered]
        # Counted in one pass: `ids.count` for each id was quadratic, 5.6 s for 20,000 mappings
        # written into the mappings graph, on the event loop at every change of that graph.
        duplicates = sorted(i for i, n in Counter(mapping.id for mapping in self.mappings).items() if n > 1)
        if duplicates:
            raise MappingError(f"mapping id(s) used twice: {', '.join(duplicates)}")
        compiled: list[Compiled] = []
        for mapping in self.mappings:
            try:
                compiled.append(compile_mapping(mapping))
            except MappingError as error:
                raise MappingError(f"mapping {mapping.id!r}: {error}") from None
        self._compiled = compiled
        self._by_first: dict[str, list[tuple[int, Compiled]]] = {}
        self._wild: list[tuple[int, Compiled]] = []
        for position, item in enumerate(compiled):
            first = item.filter.first_literal
            if first is None:
                self._wild.append((position, item))
            else:
                self._by_first.setdefault(first, []).append((position, item))
        self.max_payload_bytes = max_payload_bytes
        self.units = units if units is not None else LearnedUnits()
        self._cache: dict[str, tuple[Compiled, dict[str, str], Resolved] | None] = {}

    def rebuild(self, mappings: Iterable[Mapping]) -> Mapper:
        """A Mapper for new mappings that keeps what this one learned (Homie units)."""
        return Mapper(mappings, max_payload_bytes=self.max_payload_bytes, units=self.units)

    def subscriptions(self) -> list[str]:
        """The MQTT filters to subscribe to (captures replaced by + and #), without repeats and
        without those another one covers (`sources.uncovered`: one copy of each message)."""
        return uncovered(list(dict.fromkeys(item.filter.subscription for item in self._compiled)))

    def match(self, topic: str) -> tuple[Compiled, dict[str, str], Resolved] | None:
        """The first mapping matching `topic`, its captures and its filled targets (cached)."""
        try:
            return self._cache[topic]
        except KeyError:
            pass
        found = self._find(topic)
        if len(self._cache) >= TOPIC_CACHE_SIZE:
            self._cache.clear()
        self._cache[topic] = found
        return found

    def _find(self, topic: str) -> tuple[Compiled, dict[str, str], Resolved] | None:
        candidates = self._by_first.get(topic.split("/", 1)[0], [])
        if self._wild:
            candidates = sorted([*candidates, *self._wild], key=lambda item: item[0])
        for _, item in candidates:
            captures = item.filter.match(topic)
            if captures is None:
                continue
            captures["topic"] = topic
            resolved = item.targets.resolve(captures) if item.targets is not None else _NO_TARGETS
            return item, captures, resolved
        return None

    def readings(self, topic: str, payload: bytes, arrival_us: int) -> list[Reading]:
        """Every reading in one message, or PayloadError (UnmappedTopic if no mapping matches).

        All or nothing: a payload that fails anywhere yields no reading. `arrival_us` makes the
        readings' keys unique when the payload carries no timestamp.
        """
        if len(payload) > self.max_payload_bytes:
            raise PayloadError(f"payload of {len(payload)} bytes is over the limit of {self.max_payload_bytes}")
        found = self.match(topic)
        if found is None:
            raise UnmappedTopic(f"no mapping for topic {topic!r}")
        compiled, captures, resolved = found
        message = Message(topic, captures, payload, arrival_us, resolved, self.units, compiled.mapping.id)
        try:
            return compiled.run(compiled, message)
        except PayloadError as error:
            raise PayloadError(f"{compiled.mapping.id}: {error}") from None
        except _EXTRACTOR_FAULTS as error:
            raise PayloadError(f"{compiled.mapping.id}: cannot read the payload ({type(error).__name__})") from None
