"""Errors of the mapping layer: one for configuration, one for data from the network."""

from __future__ import annotations


class MappingError(ValueError):
    """A mapping that cannot work (bad filter, bad regex, unknown extractor...); names the entry."""


class PayloadError(ValueError):
    """A message a mapping cannot read (not a number, bad JSON, too big...): nothing is produced from it."""


class UnmappedTopic(PayloadError):
    """No mapping matches the topic: counted like a bad payload, but worth telling apart in metrics."""


class NodeLimit(PayloadError):
    """A reading of a sensor and property the store has no latest node for, past the bound on such
    nodes (in all, or of its sensor): the writer stores the batch's other readings without it."""
