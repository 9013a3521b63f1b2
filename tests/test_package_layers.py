"""The packages stand in layers: no package imports one that imports it back, at any depth (issue 32 item 3).

A node is a package of ``tfdp_sparse`` (``tfdp_sparse/mechanisms``) or a
top-level module of it (``tfdp_sparse/export``), or one of the folders above
the library (``trainers``, ``models``, ``experiments``, ``benchmarks``). An
edge ``A -> B`` is any import of ``B`` by a file of ``A``, imports inside
functions included. The graph must have no cycle, so every import runs down:
shard rows and read hooks sit in ``tables/`` below clipping, the mechanisms and
the layers; the pending-noise error beside the mechanisms; ``DPEmbedding``
brings its clipping rule, and mechanisms bind it as a ``HookedLayer``.
"""
from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ABOVE = ("trainers", "models", "experiments", "benchmarks")
#: The core's order, lowest first, as docs/ARCHITECTURE.md draws it.
CORE = ("tables", "clipping", "mechanisms", "step", "layers", "distribute")


def _node(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] in ABOVE:
        return parts[0]
    if parts[0] == "tfdp_sparse" and len(parts) > 1:
        return f"tfdp_sparse/{parts[1]}"
    return None


def _imported(source: str, package: str) -> set[str]:
    """Nodes a file of ``package`` imports (``from tfdp_sparse import x`` names ``tfdp_sparse/x``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {_node(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(_node(node.module))
            if node.module == "tfdp_sparse":
                found |= {_node(f"tfdp_sparse.{alias.name}") for alias in node.names}
    return found - {None, package}


def package_graph(root: str = ROOT) -> dict[str, set[str]]:
    """``{node: nodes it imports}`` of the library and the folders above it."""
    graph: dict[str, set[str]] = {}
    for top in ("tfdp_sparse",) + ABOVE:
        for folder, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, root).split(os.sep)
                if rel == ["tfdp_sparse", "__init__.py"]:
                    continue  # the facade: it only hands names on
                node = _node(".".join(rel)[:-3]) if top == "tfdp_sparse" else top
                with open(path) as f:
                    graph.setdefault(node, set()).update(_imported(f.read(), node))
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or ``[]``."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_no_package_imports_one_that_imports_it_back():
    graph = package_graph()
    assert "tfdp_sparse/tables" in graph and "trainers" in graph  # the walk found the tree
    assert cycle_in(graph) == [], "packages that reach each other: " + " -> ".join(cycle_in(graph))


def test_the_core_runs_down_in_its_drawn_order():
    graph = package_graph()
    for i, lower in enumerate(CORE):
        upper = {f"tfdp_sparse/{p}" for p in CORE[i + 1:]}
        assert not graph[f"tfdp_sparse/{lower}"] & upper, f"{lower} imports {graph[f'tfdp_sparse/{lower}'] & upper}"


@pytest.mark.parametrize("source, expected", [
    ("def f():\n    from tfdp_sparse.layers.embedding import DPEmbedding\n", {"tfdp_sparse/layers"}),
    ("from tfdp_sparse import export, mechanisms\n", {"tfdp_sparse/export", "tfdp_sparse/mechanisms"}),
    ("import trainers.loop\nimport numpy\n", {"trainers"}),
])
def test_imports_inside_functions_and_package_imports_count(source, expected):
    assert _imported(source, "tfdp_sparse/clipping") == expected


def test_a_cycle_is_found():
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b"}, "b": set()}) == []
