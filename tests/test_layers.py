"""The architecture, as a test: which code may import what (docs/architecture.md, "Layers").

What it protects, by walking every import statement of the project (function-level ones too,
`if TYPE_CHECKING:` blocks excepted):
- code outside broker/ uses the broker through broker.api only (white-box tests under tests/broker/
  excepted): the engine may change shape without breaking its users;
- no cycle between top-level folders (broker <- gateway <- adapters, tools, cloud, examples), and
  none between files: each module can be read, tested and moved with what it imports;
- no `_private` name is imported from another module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("broker", "gateway", "adapters", "tools", "cloud")
SCANNED = (*PACKAGES, "examples", "tests")
TOP_LEVEL = (*PACKAGES, "examples")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> Iterator[tuple[str, Path]]:
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "node_modules" not in path.parts:
                yield _module_name(path), path


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path, module: str) -> Iterator[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import outside TYPE_CHECKING blocks."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if _type_checking(node):
            stack.extend(node.orelse)  # type: ignore[attr-defined]
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield base, alias.name, node.lineno
        stack.extend(ast.iter_child_nodes(node))


MODULES = dict(_sources())


def _target(imported: str, name: str | None) -> str | None:
    """The project module an import binds to (`from pkg import module` counts as the module)."""
    if name is not None and f"{imported}.{name}" in MODULES:
        return f"{imported}.{name}"
    return imported if imported in MODULES else None


def _edges() -> Iterator[tuple[str, str, str | None, int]]:
    for module, path in MODULES.items():
        for imported, name, line in _imports(path, module):
            target = _target(imported, name)
            if target is not None and target != module:
                yield module, target, name, line


EDGES = list(_edges())


def test_outside_broker_only_the_public_api_is_imported() -> None:
    offending = [
        f"{source}:{line} imports {target}"
        for source, target, _name, line in EDGES
        if not source.startswith(("broker.", "tests.broker."))
        and source != "broker"
        and target.startswith("broker.")
        and target != "broker.api"
    ]
    assert not offending, "\n".join(offending)


def test_no_private_name_is_imported_from_another_module() -> None:
    offending = [
        f"{source}:{line} imports {name} from {target}"
        for source, target, name, line in EDGES
        if name is not None and name.startswith("_") and not name.startswith("__")
    ]
    assert not offending, "\n".join(offending)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_cycle_between_top_level_folders() -> None:
    graph: dict[str, set[str]] = {}
    for source, target, _name, _line in EDGES:
        top_source, top_target = source.split(".")[0], target.split(".")[0]
        if top_source in TOP_LEVEL and top_target in TOP_LEVEL and top_source != top_target:
            graph.setdefault(top_source, set()).add(top_target)
    assert not _cycles(graph)


def test_no_cycle_between_files() -> None:
    graph: dict[str, set[str]] = {}
    for source, target, _name, _line in EDGES:
        if not source.startswith("tests") and not target.startswith("tests"):
            graph.setdefault(source, set()).add(target)
    # a package's __init__ re-exporting its modules is not a cycle of files
    graph = {
        source: {t for t in targets if not (t == source.rpartition(".")[0] or source == t.rpartition(".")[0])}
        for source, targets in graph.items()
    }
    assert not _cycles(graph)


def test_no_sys_path_manipulation() -> None:
    """Tests, tools and examples import the project as packages (pytest puts the checkout on the
    path for `tests`); none edits sys.path to reach a helper."""
    offending = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "path" and ast.unparse(node.value) == "sys":
                offending.append(f"{module}:{node.lineno}")
    assert not offending, "\n".join(offending)
