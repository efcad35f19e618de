"""No import cycle anywhere in ``appliance/``: every ``import`` is an edge, wherever it is
written — at the top, inside a function, under ``if TYPE_CHECKING:`` — so a cycle cannot
be hidden by deferring one side of it (issue 15, item 5). ``importlib`` calls with a module
name in a string (cli.py's role table) are not edges; nothing the roles import leads back
to cli.py (its helpers live in heap.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "appliance"


def _modules() -> dict[str, Path]:
    """Every module by dotted name; a C extension is known by its ``.pyi`` stub."""
    out = {}
    for path in [*ROOT.rglob("*.py"), *ROOT.rglob("*.pyi")]:
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _edges(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                # `from pkg import mod` imports the module pkg.mod; `from mod import name`
                # imports mod.
                found.add(sub if sub in known else target)
    return {m for m in found if m in known and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_checker_sees_a_deferred_cycle(tmp_path: Path) -> None:
    """The check itself: a cycle through a function-level import is found."""
    pkg = tmp_path / "appliance"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    known = {"appliance": pkg / "__init__.py", "appliance.a": pkg / "a.py",
             "appliance.b": pkg / "b.py"}
    graph = {n: _edges(n, p, known) for n, p in known.items()}
    assert _cycles(graph) == [["appliance.a", "appliance.b"]]


def test_no_import_cycles_in_appliance() -> None:
    known = _modules()
    graph = {name: _edges(name, path, known) for name, path in known.items()}
    assert sum(len(e) for e in graph.values()) > 50  # the walk really found the imports
    assert _cycles(graph) == []
