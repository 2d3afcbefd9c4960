"""The retention design before the find/delete split, kept as the tests' oracle and cost baseline.

One update did everything: its WHERE clause joined the whole observations graph to find what is
beyond the retention, on the update thread (~0.4 s per step at 30k observations even when it
deleted nothing). The new design must delete exactly what this deleted, for far less work on the
update thread.
"""

from __future__ import annotations

from gateway.observations.updates import PROLOGUE
from gateway.observations.vocabulary import FN, GRAPH_LATEST, GRAPH_OBSERVATIONS


def prune_update(retain_count: int, retain_age_s: float, *, limit: int = 20_000) -> str:
    """A SPARQL update deleting observations (and their results) beyond the retention.

    An observation goes when its sensor and property have `retain_count` newer ones (by sequence
    number), or when its resultTime is older than `retain_age_s` seconds of engine time. At most
    `limit` observations per run (bounded delta); run it until it deletes nothing. Evaluation is a
    linear join over the observations graph. The latest view is not touched (after an age prune,
    a silent sensor's gw:observation may name a pruned observation: its value stays).
    """
    age = f'"PT{retain_age_s:.6f}S"^^x:dayTimeDuration'
    return f"""{PROLOGUE}DELETE {{ GRAPH <{GRAPH_OBSERVATIONS}> {{ ?obs ?p ?o . ?result ?rp ?ro }} }}
WHERE {{
  {{ SELECT DISTINCT ?obs WHERE {{
      {{
        GRAPH <{GRAPH_LATEST}> {{ ?latest g:sensor ?sensor ; g:property ?property ; g:sequenceNumber ?last }}
        GRAPH <{GRAPH_OBSERVATIONS}> {{
          ?obs s:madeBySensor ?sensor ; s:observedProperty ?property ; g:sequenceNumber ?sequence
        }}
        FILTER(?sequence <= ?last - {retain_count})
      }} UNION {{
        GRAPH <{GRAPH_OBSERVATIONS}> {{ ?obs s:resultTime ?time }}
        FILTER(?time < <{FN}now>() - {age})
      }}
    }} LIMIT {limit} }}
  GRAPH <{GRAPH_OBSERVATIONS}> {{ ?obs ?p ?o }}
  OPTIONAL {{ GRAPH <{GRAPH_OBSERVATIONS}> {{ ?obs s:hasResult ?result . ?result ?rp ?ro }} }}
}}
"""
