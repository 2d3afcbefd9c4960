"""What an observation batch inserts, as the observation layer knows it: one flat entry per observation.

Why: the cloud shipper flattens every new observation into a record. Read back from the batch's
quads, that costs a Python object per term of ~11 fresh pyoxigraph quads per observation, more than
the rest of the shipper. The batch builder (quads.py) holds every value already, so it writes them
down once more as the digest of its Update (broker.api.Digest). The engine hands the
digest to the observations graph's feed only when the batch added every quad it inserts; then the
digest says exactly what those quads say (tests/gateway/shipper/test_records_digest.py compares the two),
and the shipper reads it instead of the quads. When it is absent the shipper reads the quads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from broker.api import Digest


class DigestEntry(NamedTuple):
    """One observation: its IRI and the values of its triples (result time: the update's instant).

    `value` is the double of a numeric result (its qudt:numericValue), `literal` the lexical form of
    a boolean or text result (its sosa:hasSimpleResult); `unit` is the qudt:unit of a numeric result;
    `source` the topic or resource the reading came from.
    """

    iri: str
    sensor: str
    property: str
    feature: str
    value: float | None
    literal: str | None
    unit: str | None
    sequence: int
    source: str


@dataclass(frozen=True, slots=True)
class ObservationDigest(Digest):
    """The observations one batch writes into the observations graph (`graph`)."""

    entries: tuple[DigestEntry, ...]
