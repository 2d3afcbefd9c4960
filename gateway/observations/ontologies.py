"""Loading ontologies/*.ttl into the ontologies named graph at start-up.

The files ship with the gateway (the repository's `ontologies/` folder) and are the truth: the
graph is replaced on every start, so an upgrade that changes a file changes the store.
"""

from __future__ import annotations

from pathlib import Path

from pyoxigraph import NamedNode, Quad, RdfFormat, parse

import ontologies
from gateway.observations.vocabulary import GRAPH_ONTOLOGIES

ONTOLOGY_DIR = Path(ontologies.__file__).resolve().parent  # shipped as package data (pyproject.toml)


def ontology_files(directory: Path = ONTOLOGY_DIR) -> list[Path]:
    """The Turtle files to load, in a stable order."""
    files = sorted(directory.glob("*.ttl"))
    if not files:
        raise FileNotFoundError(f"no ontology files (*.ttl) in {directory}")
    return files


def ontology_quads(directory: Path = ONTOLOGY_DIR) -> list[Quad]:
    """Every triple of every file, placed in the ontologies graph (a parse error names the file)."""
    graph = NamedNode(GRAPH_ONTOLOGIES)
    quads: list[Quad] = []
    for path in ontology_files(directory):
        try:
            for quad in parse(path=str(path), format=RdfFormat.TURTLE):
                quads.append(Quad(quad.subject, quad.predicate, quad.object, graph))
        except SyntaxError as error:
            raise SyntaxError(f"{path.name}: {error}") from None
    return quads


def ontology_update(directory: Path = ONTOLOGY_DIR) -> str:
    """One update request replacing the ontologies graph with the files' content."""
    lines = [f"{quad.subject} {quad.predicate} {quad.object} ." for quad in ontology_quads(directory)]
    body = "\n".join(lines)
    return f"DROP SILENT GRAPH <{GRAPH_ONTOLOGIES}> ;\nINSERT DATA {{ GRAPH <{GRAPH_ONTOLOGIES}> {{\n{body}\n}} }}"


__all__ = ["ONTOLOGY_DIR", "ontology_files", "ontology_quads", "ontology_update"]
