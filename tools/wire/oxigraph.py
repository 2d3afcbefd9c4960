"""The baseline: an Oxigraph SPARQL server (``oxigraph serve``) fed the same update stream.

Why Oxigraph: the gateway's store *is* Oxigraph (embedded through pyoxigraph), so its server is
the bare SPARQL endpoint the gateway would be without subscriptions, Python and the SEPA layer;
``ratio = ups / oxigraph_ups`` is what the broker costs. The PyPI package ``oxigraph`` ships the
server binary into the virtualenv's ``bin`` (``pip install oxigraph``, or the ``test`` extra).
Without a ``--location`` the server keeps its store in memory, like the benchmark's gateway.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from tools.wire.processes import HOST, Child, Children, free_port, wait_http

INSTALL_HINT = "the Oxigraph server is not installed: pip install oxigraph (or the project's 'test' extra)"


def find_binary() -> str | None:
    """The ``oxigraph`` executable next to this interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / "oxigraph"
    if beside.is_file():
        return str(beside)
    return shutil.which("oxigraph")


@dataclass(frozen=True)
class OxigraphProcess:
    child: Child
    port: int

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def update_url(self) -> str:
        return f"{self.base_url}/update"

    @property
    def query_url(self) -> str:
        return f"{self.base_url}/query"


def start(children: Children, binary: str, workdir: Path, timeout: float = 30.0) -> OxigraphProcess:
    """``oxigraph serve --bind 127.0.0.1:PORT`` (in-memory store), once it answers HTTP."""
    port = free_port()
    child = children.start("oxigraph", [binary, "serve", "--bind", f"{HOST}:{port}"], log_path=workdir / "oxigraph.log")
    wait_http(f"http://{HOST}:{port}/", child, timeout)
    return OxigraphProcess(child, port)
