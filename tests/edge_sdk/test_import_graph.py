"""The shape of edge_sdk's import graph, read from the source with an AST walk (no import runs).

Every import counts for loops and layers: module level, function-local and ``TYPE_CHECKING``
ones (each says that one module knows another). The depth an import pays is the longest chain
of module-level imports (those that run when a module is imported), measured in modules.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "edge_sdk"
MAX_CHAIN = 8  # modules in the longest chain of module-level imports
MAX_LINES = {"edge_sdk": 400, "trainer": 500, "exporters": 500, "demos": 500}
FOUNDATION = ("edge_sdk.errors", "edge_sdk.validation")  # below every subpackage
# subpackages whose __init__ re-exports their parts (their public import paths predate the
# arrangement by concept); every other subpackage's __init__ imports nothing
REEXPORTING = ("edge_sdk.backends", "edge_sdk.bundle", "edge_sdk.store")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    kind: str  # "module" (runs on import), "function" (runs when called), "typing"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p): p for p in sorted(package.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def _imports(tree: ast.Module):
    """(node, kind) for every import statement, the kind from where it stands."""
    def walk(body, kind):
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node, kind
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                yield from walk(node.body, "typing")
                yield from walk(node.orelse, kind)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(node.body, "function")
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    yield from walk(getattr(node, field, []) or [], kind)
    yield from walk(tree.body, "module")


def edges(mods: dict[str, Path]) -> list[Edge]:
    out = []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, kind in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                # `from pkg import submodule` imports the submodule, as grimp counts it
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                targets = subs + ([base] if len(subs) < len(node.names) else [])
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    out.append(Edge(name, t, node.lineno, kind))
    return out


def adjacency(es: list[Edge], kinds: tuple[str, ...]) -> dict[str, set[str]]:
    adj: dict[str, set[str]] = {}
    for e in es:
        adj.setdefault(e.source, set())
        adj.setdefault(e.target, set())
        if e.kind in kinds:
            adj[e.source].add(e.target)
    return adj


def loops(adj: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(adj[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(adj):
        if v not in index:
            visit(v)
    return found


def longest_chain(adj: dict[str, set[str]]) -> list[str]:
    """The longest import chain (a DAG: the loop test holds first)."""
    memo: dict[str, list[str]] = {}

    def chain(v: str) -> list[str]:
        if v not in memo:
            memo[v] = [v] + max((chain(w) for w in sorted(adj[v])), key=len, default=[])
        return memo[v]

    return max((chain(v) for v in sorted(adj)), key=len)


def declared_layers(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Subpackage -> the packages and modules its ``__init__`` docstring says it imports
    (the line ``Imports: a, b.``; ``every other ... but x``: all but x; ``anything``: all)."""
    subpackages = sorted(n for n, p in mods.items() if p.name == "__init__.py" and "." in n)
    top = sorted(set(subpackages) | set(FOUNDATION))
    out = {}
    for name in subpackages:
        doc = ast.get_docstring(ast.parse(mods[name].read_text(encoding="utf-8"))) or ""
        m = re.search(r"^Imports: (.+?)\.\s*$", doc, re.M | re.S)
        assert m, f"{name}/__init__.py: its docstring must say what it imports ('Imports: ...')"
        text = " ".join(m.group(1).split())
        named = set(re.findall(r"edge_sdk(?:\.\w+)?", text))
        if text.startswith("every other"):
            named = set(top) - named - {name}
        elif text.startswith("anything"):  # the top layer: the public API included
            named = set(top) | {"edge_sdk"}
        out[name] = named
    return out


def owner(module: str, packages) -> str:
    """The subpackage (or foundation module) a module belongs to."""
    for p in sorted(packages, key=len, reverse=True):
        if module == p or module.startswith(p + "."):
            return p
    return module


@pytest.fixture(scope="module")
def graph():
    mods = modules()
    return mods, edges(mods)


def test_no_import_loop_counting_every_import(graph):
    _, es = graph
    assert loops(adjacency(es, ("module", "function", "typing"))) == []


def test_the_longest_chain_of_module_level_imports_is_short(graph):
    _, es = graph
    chain = longest_chain(adjacency(es, ("module",)))
    assert len(chain) <= MAX_CHAIN, " -> ".join(chain)


def test_every_import_goes_down_to_a_layer_the_package_declares(graph):
    mods, es = graph
    layers = declared_layers(mods)
    packages = set(layers) | set(FOUNDATION)
    wrong = []
    for e in es:
        src, dst = owner(e.source, packages), owner(e.target, packages)
        if src == dst or dst == "edge_sdk.errors":
            continue
        if src == "edge_sdk":  # the public API: lazily, whatever it re-exports
            ok = dst != "edge_sdk.cli"
        elif src == "edge_sdk.validation":
            ok = False
        else:
            ok = dst in layers.get(src, set())
        if not ok:
            wrong.append(f"{e.source}:{e.line} imports {e.target} ({e.kind})")
    assert wrong == []


def test_the_declared_layers_are_an_order(graph):
    mods, _ = graph
    layers = declared_layers(mods)
    adj = {p: {q for q in named if q in layers} for p, named in layers.items()}
    assert loops(adj) == []


def test_new_subpackages_import_nothing_when_imported(graph):
    mods, _ = graph
    for name, path in mods.items():
        if path.name != "__init__.py" or name == "edge_sdk" or name in REEXPORTING:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                    ], f"{name}/__init__.py imports: subpackages load their parts on use"


@pytest.mark.parametrize("package", sorted(MAX_LINES))
def test_no_module_is_too_long(package):
    limit = MAX_LINES[package]
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / package).rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > limit}
    assert long == {}, f"over {limit} lines: split by job"


@pytest.mark.parametrize("package", ["edge_sdk", "trainer", "exporters", "demos"])
def test_the_code_cites_papers_and_docs_not_issue_numbers(package):
    # issue numbers belong in the CHANGELOG and docs/, which a reader outside the repository
    # can open; the code says what and why
    pattern = re.compile(r"\bissues?\s*#?\d+|#\d{2,}\b", re.I)
    found = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / package).rglob("*.py"))
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if pattern.search(line)]
    assert found == []


def test_the_walk_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "edge_sdk"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("")
    (pkg / "c.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from edge_sdk.sub import b\n"
        "if TYPE_CHECKING:\n    from edge_sdk import c\n"
        "def f():\n    from . import c\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        mods = modules(pkg)
        got = {(e.source, e.target, e.kind) for e in edges(mods)}
    finally:
        ROOT = saved
    assert got == {("edge_sdk.a", "edge_sdk.sub.b", "module"),
                   ("edge_sdk.a", "edge_sdk.c", "typing"),
                   ("edge_sdk.a", "edge_sdk.c", "function")}
    adj = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert loops(adj) == [["a", "b", "c"]]
    assert longest_chain({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"c"}}) == ["a", "b", "c"]
