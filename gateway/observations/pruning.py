"""SPARQL for retention pruning, split into a read-only *find* and a cheap *delete*.

Why split: finding what is beyond the retention means a join over the whole observations graph
(every observation's sensor, property and sequence number against its latest node). Run as the
WHERE clause of an update, that join held the update thread for ~0.4 s per step at 30k
observations, even when nothing was old enough, and every reading waited behind it. As a query it
runs on the query pool, where pyoxigraph evaluates it without the GIL (measured: the event loop
kept its 1 ms ticks during a 0.15 s join). Only the deletion goes through the update path: a
`VALUES` list of known subjects, each deleted by one index lookup, in small updates.

The find queries return each candidate observation with its result node (`?result`, unbound for
boolean and string readings), at most `limit` rows, so converting the rows to Python (which does
hold the GIL) stays bounded too. Deleting an observation that is already gone deletes nothing, so
a find racing with anything else is harmless; and candidates only ever stay candidates (sequence
numbers and the engine clock only grow).

The latest view loses a node once its sensor and property have been silent for longer than the
age retention (`silent_latest_query`, then `evict_update`): its observations are gone by then, and
a node kept for ever held one of the `max_sensor_properties` slots for ever, so sensor churn
(devices replaced or renamed over months, or ~10 logins each naming 1,000 properties) left every
new sensor refused until a restart (13,361 refusals counted in one churn pass). The eviction is
conditional on the node being still silent when it runs, so a reading racing with it keeps its node.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from pyoxigraph import NamedNode

from gateway.jsap.terms import TermError, iri_term
from gateway.observations.updates import PROLOGUE
from gateway.observations.vocabulary import FN, GRAPH_LATEST, GRAPH_OBSERVATIONS

_OBS = f"GRAPH <{GRAPH_OBSERVATIONS}>"

# The highest sequence number of any sensor and property: while it is at most retain_count, no
# observation can be beyond the count retention and the join is not worth running.
MAX_SEQUENCE_QUERY = f"""{PROLOGUE}SELECT (MAX(?last) AS ?max) WHERE {{
  GRAPH <{GRAPH_LATEST}> {{ ?latest g:sequenceNumber ?last }}
}}
"""


def _check(retain_count: int, retain_age_s: float, limit: int) -> None:
    if isinstance(retain_count, bool) or not isinstance(retain_count, int) or retain_count < 1:
        raise ValueError("retain_count must be an integer >= 1 (the latest observation is always kept)")
    if not (isinstance(retain_age_s, int | float) and math.isfinite(retain_age_s) and retain_age_s > 0):
        raise ValueError("retain_age_s must be a positive number of seconds")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError("limit must be an integer >= 1")


def count_candidates_query(retain_count: int, *, limit: int) -> str:
    """Observations with `retain_count` newer ones of their sensor and property (by sequence number).

    Starts from the latest nodes (one per sensor and property, which hold the last sequence
    number), so its cost is one pass over the observations of the sensors that have one.
    """
    _check(retain_count, 1, limit)
    return f"""{PROLOGUE}SELECT ?obs ?result WHERE {{
  GRAPH <{GRAPH_LATEST}> {{ ?latest g:sensor ?sensor ; g:property ?property ; g:sequenceNumber ?last }}
  {_OBS} {{ ?obs s:madeBySensor ?sensor ; s:observedProperty ?property ; g:sequenceNumber ?sequence }}
  FILTER(?sequence <= ?last - {retain_count})
  OPTIONAL {{ {_OBS} {{ ?obs s:hasResult ?result }} }}
}} LIMIT {limit}
"""


def age_candidates_query(retain_age_s: float, *, limit: int) -> str:
    """Observations whose resultTime is more than `retain_age_s` seconds before the engine clock.

    Every observation, with or without a latest node: one scan of the resultTime triples. The
    cutoff is bound once (calling the clock, a Python function, per row made the scan 20x slower)
    and the result nodes are joined to the candidates only (the OPTIONAL over the whole scan made
    it 10x slower: 140 ms against 14 ms at 30k observations, measured).
    """
    _check(1, retain_age_s, limit)
    return f"""{PROLOGUE}SELECT ?obs ?result WHERE {{
  {{ SELECT ?obs WHERE {{
    BIND({_cutoff(retain_age_s)} AS ?cutoff)
    {_OBS} {{ ?obs s:resultTime ?time }}
    FILTER(?time < ?cutoff)
  }} LIMIT {limit} }}
  OPTIONAL {{ {_OBS} {{ ?obs s:hasResult ?result }} }}
}}
"""


def silent_latest_query(retain_age_s: float, *, limit: int) -> str:
    """Latest nodes whose gw:resultTime (the last reading's arrival) is older than `retain_age_s`
    seconds before the engine clock: one scan of the latest graph's resultTime triples."""
    _check(1, retain_age_s, limit)
    return f"""{PROLOGUE}SELECT ?latest WHERE {{
  BIND({_cutoff(retain_age_s)} AS ?cutoff)
  GRAPH <{GRAPH_LATEST}> {{ ?latest g:resultTime ?time }}
  FILTER(?time < ?cutoff)
}} LIMIT {limit}
"""


def evict_update(nodes: Iterable[object], retain_age_s: float) -> str | None:
    """One update deleting these latest nodes whole, each only if it is still silent for longer than
    `retain_age_s` (a reading since the find keeps it); None when there is nothing to delete."""
    _check(1, retain_age_s, 1)
    iris = _iris(nodes)
    if not iris:
        return None
    return (
        f"{PROLOGUE}DELETE {{ GRAPH <{GRAPH_LATEST}> {{ ?s ?p ?o }} }}\nWHERE {{ VALUES ?s {{ {' '.join(iris)} }}\n"
        f"  BIND({_cutoff(retain_age_s)} AS ?cutoff)\n"
        f"  GRAPH <{GRAPH_LATEST}> {{ ?s g:resultTime ?time . ?s ?p ?o }}\n  FILTER(?time < ?cutoff) }}\n"
    )


def _cutoff(retain_age_s: float) -> str:
    """The SPARQL expression of the age cutoff (the engine clock less the age)."""
    return f'<{FN}now>() - "PT{retain_age_s:.6f}S"^^x:dayTimeDuration'


def delete_update(subjects: Iterable[object]) -> str | None:
    """One update deleting every triple of these subjects (observations and their result nodes) in
    the observations graph, and nothing else; subjects already gone delete nothing.

    None when there is nothing to delete. Blank nodes are skipped (no update can name them; the
    gateway never writes observations as blank nodes), and so are IRIs a SPARQL update could not
    carry (a writer other than the gateway's may have used one): pruning must never stop on them.
    """
    iris = _iris(subjects)
    if not iris:
        return None
    return f"DELETE {{ {_OBS} {{ ?s ?p ?o }} }}\nWHERE {{ VALUES ?s {{ {' '.join(iris)} }} {_OBS} {{ ?s ?p ?o }} }}\n"


def _iris(terms: Iterable[object]) -> list[str]:
    """The distinct IRIs among `terms` as SPARQL text (see `delete_update` for what is skipped)."""
    return [text for term in dict.fromkeys(terms) if isinstance(term, NamedNode) and (text := _iri(term))]


def _iri(term: NamedNode) -> str | None:
    try:
        return iri_term(term.value).text
    except TermError:
        return None
