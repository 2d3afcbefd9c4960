"""W3C SPARQL 1.1 Update syntax tests: the engine accepts exactly the well-formed requests.

A rejected request must raise SparqlSyntaxError naming line and column (the gates pass that message
on to clients) and must leave the store untouched.
"""

from __future__ import annotations

import pytest
from pyoxigraph import DefaultGraph, NamedNode, Quad

from broker.core.engine import Engine
from broker.errors import InvalidRequest, SparqlSyntaxError, UpdateFailed

from .manifest import NEGATIVE_SYNTAX, POSITIVE_SYNTAX, ManifestEntry, entries

POSITIVE = [pytest.param(e, id=e.id) for e in entries((POSITIVE_SYNTAX,))]
NEGATIVE = [pytest.param(e, id=e.id) for e in entries(NEGATIVE_SYNTAX)]

_EX = "http://example.org/"
# Seed data for negative tests, so that "unchanged" is checked against a non-empty store.
SEED = [
    Quad(NamedNode(_EX + "s"), NamedNode(_EX + "p"), NamedNode(_EX + "o"), DefaultGraph()),
    Quad(NamedNode(_EX + "s"), NamedNode(_EX + "p"), NamedNode(_EX + "o"), NamedNode(_EX + "g")),
]


def run(engine: Engine, case: ManifestEntry) -> None:
    """Send the test's request, relative IRIs resolved against its file."""
    engine.update(case.request.read_text(encoding="utf-8"), base_iri=case.request.as_uri())


@pytest.mark.parametrize("case", POSITIVE)
def test_positive_update_syntax(case: ManifestEntry) -> None:
    """A valid request must parse; run-time refusals (LOAD disabled, DROP of a missing graph) are fine."""
    try:
        run(Engine(), case)
    except (InvalidRequest, UpdateFailed):
        pass
    except SparqlSyntaxError as exc:
        pytest.fail(f"valid request rejected: {exc}")


@pytest.mark.parametrize("case", NEGATIVE)
def test_negative_update_syntax(case: ManifestEntry) -> None:
    """A malformed request raises SparqlSyntaxError with line and column and changes nothing."""
    engine = Engine()
    engine.store.ox.extend(SEED)
    with pytest.raises(SparqlSyntaxError, match=r"line \d+, column \d+"):
        run(engine, case)
    assert set(engine.store.ox.quads_for_pattern(None, None, None, None)) == set(SEED)
