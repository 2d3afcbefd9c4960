"""Reader for the W3C SPARQL 1.1 Update and Query test manifests (copied under tests/broker/w3c/data/).

The manifests are RDF, so they are read with rdflib rather than by pattern matching: blank-node
action/result descriptions, repeated ut:graphData and rdf:List entries are all handled for free.
No test in the copied update folders is marked `dawgt:approval dawgt:Withdrawn` (all are Approved);
Withdrawn entries are nevertheless skipped, as the W3C suite prescribes. The query folders also hold
Proposed and unapproved entries: `approved` tells them apart, and the query tests run the Approved ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from rdflib import RDF, RDFS, Graph, Namespace, URIRef
from rdflib.collection import Collection
from rdflib.term import Node

DATA_DIR = Path(__file__).resolve().parent / "data"

MF = Namespace("http://www.w3.org/2001/sw/DataAccess/tests/test-manifest#")
UT = Namespace("http://www.w3.org/2009/sparql/tests/test-update#")
DAWGT = Namespace("http://www.w3.org/2001/sw/DataAccess/tests/test-dawg#")
QT = Namespace("http://www.w3.org/2001/sw/DataAccess/tests/test-query#")

EVALUATION_FOLDERS = (
    "add",
    "basic-update",
    "clear",
    "copy",
    "delete",
    "delete-data",
    "delete-insert",
    "delete-where",
    "drop",
    "move",
    "update-silent",
)
SYNTAX_FOLDERS = ("syntax-update-1", "syntax-update-2")
# The folders manifest-sparql11-query.ttl includes, and the two result-format ones of
# manifest-sparql11-results.ttl (json-res, csv-tsv-res).
QUERY_FOLDERS = (
    "aggregates",
    "bind",
    "bindings",
    "cast",
    "construct",
    "exists",
    "functions",
    "grouping",
    "negation",
    "project-expression",
    "property-path",
    "subquery",
    "syntax-query",
    "json-res",
    "csv-tsv-res",
)

EVALUATION = "UpdateEvaluationTest"
POSITIVE_SYNTAX = "PositiveUpdateSyntaxTest11"
# delete-insert types its bnode-in-DELETE-template cases as the query-suite mf:NegativeSyntaxTest11
# although their actions are update requests (.ru): they are negative *update* syntax tests.
NEGATIVE_SYNTAX = ("NegativeUpdateSyntaxTest11", "NegativeSyntaxTest11")
QUERY_EVALUATION = "QueryEvaluationTest"
POSITIVE_QUERY_SYNTAX = "PositiveSyntaxTest11"
NEGATIVE_QUERY_SYNTAX = "NegativeSyntaxTest11"
CSV_RESULT_FORMAT = "CSVResultFormatTest"


@dataclass(frozen=True, slots=True)
class DatasetSpec:
    """An RDF dataset described by a manifest: default-graph files and (graph IRI, file) pairs."""

    default: tuple[Path, ...] = ()
    named: tuple[tuple[str, Path], ...] = ()


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One W3C test. `id` is "folder/local-name", used as the pytest id. A query test's expected
    results are in the file `result` (.srx, .srj, .tsv, .csv or, for CONSTRUCT, .ttl)."""

    id: str
    name: str
    kind: str
    request: Path
    data: DatasetSpec
    expected: DatasetSpec
    expect_error: bool = False
    result: Path | None = None
    approved: bool = True


def _path(node: Node | None) -> Path:
    """Turn a file:// IRI (relative IRIs were resolved against the manifest) into a path."""
    parsed = urlparse(str(node))
    if parsed.scheme != "file":
        raise ValueError(f"manifest refers to a non-local file: {node}")
    return Path(unquote(parsed.path))


def _dataset(g: Graph, node: Node | None) -> DatasetSpec:
    """Read ut:data / qt:data (default graph) and the named graphs: ut:graphData [ut:graph;
    rdfs:label] in update tests, qt:graphData <file> (the graph is named by the file's IRI) in query tests."""
    if node is None:
        return DatasetSpec()
    default = tuple(sorted(_path(d) for d in [*g.objects(node, UT.data), *g.objects(node, QT.data)]))
    named = [(str(file), _path(file)) for file in g.objects(node, QT.graphData)]
    for gd in g.objects(node, UT.graphData):
        label = g.value(gd, RDFS.label)
        file = g.value(gd, UT.graph)
        if label is None or file is None:
            raise ValueError(f"ut:graphData without ut:graph or rdfs:label in {node}")
        named.append((str(label), _path(file)))
    return DatasetSpec(default, tuple(sorted(named)))


def _expects_error(g: Graph, result: Node | None) -> bool:
    """True when mf:result declares an outcome other than ut:success (none do in this suite)."""
    outcome = g.value(result, UT.result) if result is not None else None
    return outcome is not None and outcome != UT.success


def read_manifest(folder: str) -> Iterator[ManifestEntry]:
    """Yield the entries of data/<folder>/manifest.ttl in mf:entries order, Withdrawn ones excepted."""
    manifest = DATA_DIR / folder / "manifest.ttl"
    g = Graph()
    g.parse(manifest, format="turtle", publicID=manifest.as_uri())
    root = URIRef(manifest.as_uri())
    for test in Collection(g, g.value(root, MF.entries)):
        if (test, DAWGT.approval, DAWGT.Withdrawn) in g:
            continue
        kind = str(g.value(test, RDF.type)).rsplit("#", 1)[-1]
        action = g.value(test, MF.action)
        result = g.value(test, MF.result)
        result_file = None
        if kind == EVALUATION:
            request = _path(g.value(action, UT.request))
            data, expected = _dataset(g, action), _dataset(g, result)
        elif g.value(action, QT.query) is not None:  # QueryEvaluationTest, CSVResultFormatTest
            request, data, expected = _path(g.value(action, QT.query)), _dataset(g, action), DatasetSpec()
            result_file = _path(result)
        else:
            request, data, expected = _path(action), DatasetSpec(), DatasetSpec()
        yield ManifestEntry(
            id=f"{folder}/{str(test).rsplit('#', 1)[-1]}",
            name=str(g.value(test, MF.name)),
            kind=kind,
            request=request,
            data=data,
            expected=expected,
            expect_error=_expects_error(g, result),
            result=result_file,
            approved=(test, DAWGT.approval, DAWGT.Approved) in g,
        )


ALL_FOLDERS = EVALUATION_FOLDERS + SYNTAX_FOLDERS


def entries(kinds: tuple[str, ...], folders: tuple[str, ...] = ALL_FOLDERS) -> list[ManifestEntry]:
    """All entries of the given types from the given folders."""
    return [e for folder in folders for e in read_manifest(folder) if e.kind in kinds]
