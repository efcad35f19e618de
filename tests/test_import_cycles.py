"""No import cycle anywhere in ``appliance/``: every ``import`` is an edge, wherever it is
written — at the top, inside a function, under ``if TYPE_CHECKING:`` — so a cycle cannot
be hidden by deferring one side of it (issue 15, item 5).

An ``import_module("…")`` string is an import arrow like any other (issue 39, item 5): a
call with a literal module name is an edge, and one whose name is computed is allowed only
where the name cannot be ours to know — cli.py's role table (nothing the roles import leads
back to cli.py: its helpers live in heap.py) and agents/loader.py, which imports the
``module:attr`` an agent spec names — or is already an edge: appliance/speech/__init__.py's
lazy names, whose modules its ``TYPE_CHECKING`` block imports. A plugin is loaded by an ordinary import in
appliance/plugins.py, never by a string in the floor it plugs into.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "appliance"
#: Modules allowed an ``import_module`` whose name is not a literal, and why (see above).
COMPUTED_IMPORTS = {"appliance.cli": "the role table", "appliance.agents.loader": "agent specs",
                    # PEP 562 lazy names (speech/__init__.py): its TYPE_CHECKING block imports
                    # every module they come from, so its edges are counted all the same
                    "appliance.speech": "its own submodules"}


def _modules() -> dict[str, Path]:
    """Every module by dotted name; a C extension is known by its ``.pyi`` stub."""
    out = {}
    for path in [*ROOT.rglob("*.py"), *ROOT.rglob("*.pyi")]:
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _import_module_calls(tree: ast.AST) -> list[ast.Call]:
    """``importlib.import_module(…)`` and ``import_module(…)`` calls (however imported)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) \
                else ""
            if name in ("import_module", "__import__"):
                out.append(node)
    return out


def _string_target(call: ast.Call, package: str) -> str | None:
    """The module a call names with a literal (relative names against ``package=`` or the
    caller's package), or None when the name is computed."""
    if not call.args or not isinstance(call.args[0], ast.Constant) \
            or not isinstance(call.args[0].value, str):
        return None
    target: str = call.args[0].value
    if target.startswith("."):
        dots = len(target) - len(target.lstrip("."))
        base = package.split(".")
        base = base[: len(base) - (dots - 1)]
        target = ".".join([*base, target[dots:]]) if target[dots:] else ".".join(base)
    return target


def _edges(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for call in _import_module_calls(tree):
        target = _string_target(call, package)
        if target is not None:
            found.add(target)
        else:
            assert name in COMPUTED_IMPORTS, (
                f"{path}:{call.lineno}: an import_module with a computed name hides an import "
                "arrow; import the module (a plugin registers itself: appliance/plugins.py)")
    for node in ast.walk(tree):
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


def test_the_checker_sees_a_cycle_through_an_import_module_string(tmp_path: Path) -> None:
    """``importlib.import_module("appliance.b")`` is an edge (issue 39: the agent registry
    reached realtime/ and speech/ that way, and the check passed)."""
    pkg = tmp_path / "appliance"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import importlib\n\ndef f():\n"
                              "    return importlib.import_module('appliance.b')\n")
    (pkg / "b.py").write_text("from importlib import import_module\n\ndef g():\n"
                              "    return import_module('.a', __package__)\n")
    (pkg / "c.py").write_text("from .a import f\n")
    known = {"appliance": pkg / "__init__.py", "appliance.a": pkg / "a.py",
             "appliance.b": pkg / "b.py", "appliance.c": pkg / "c.py"}
    graph = {n: _edges(n, p, known) for n, p in known.items()}
    assert _cycles(graph) == [["appliance.a", "appliance.b"]]


def test_the_checker_refuses_a_computed_import_module(tmp_path: Path) -> None:
    pkg = tmp_path / "appliance"
    pkg.mkdir()
    (pkg / "a.py").write_text("import importlib\n\ndef f(n):\n"
                              "    return importlib.import_module(f'appliance.{n}')\n")
    with pytest.raises(AssertionError, match="computed name"):
        _edges("appliance.a", pkg / "a.py", {"appliance.a": pkg / "a.py"})


def test_no_import_cycles_in_appliance() -> None:
    known = _modules()
    graph = {name: _edges(name, path, known) for name, path in known.items()}
    assert sum(len(e) for e in graph.values()) > 50  # the walk really found the imports
    assert _cycles(graph) == []
