"""The call core is sans-IO (call.py docstring): neither ServerCall nor anything of ours it
imports may import an I/O or clock library (the rule tests/proto/test_sans_io.py applies
to appliance/proto)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"trio", "asyncio", "socket", "time", "selectors", "select", "threading",
             "subprocess", "logging", "anyio"}
CORES = ("appliance/transceiver/call.py", "appliance/transceiver/flight_budget.py",
         "appliance/transceiver/rtcp.py",
         "appliance/transceiver/passthrough.py", "appliance/session_info.py")


def _imports(path: Path) -> set[str]:
    """Absolute module names ``path`` imports (relative imports resolved)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.add(base)
    return names


def _closure(start: Path) -> dict[str, set[str]]:
    """Every appliance module reachable from ``start``, with what each imports."""
    seen: dict[str, set[str]] = {}
    todo = [start]
    while todo:
        path = todo.pop()
        key = str(path.relative_to(ROOT))
        if key in seen:
            continue
        seen[key] = _imports(path)
        for name in seen[key]:
            if name.split(".")[0] != "appliance":
                continue
            mod = ROOT.joinpath(*name.split("."))
            for candidate in (mod.with_suffix(".py"), mod / "__init__.py"):
                if candidate.exists():
                    todo.append(candidate)
    return seen


@pytest.mark.parametrize("core", CORES)
def test_call_core_imports_no_io(core: str) -> None:
    for module, names in _closure(ROOT / core).items():
        bad = {n for n in names for f in FORBIDDEN if n == f or n.startswith(f + ".")}
        assert not bad, f"{core} reaches {module}, which imports {sorted(bad)}"


def test_checker_follows_imports() -> None:
    assert "appliance.transceiver.rtcp" in _imports(ROOT / "appliance/transceiver/call.py")
    reached = _closure(ROOT / "appliance/transceiver/call.py")
    assert {"appliance/proto/dtls/connection.py", "appliance/transceiver/rtcp.py",
            "appliance/session_info.py"} <= set(reached)
    # media.py is not a core: it calls the agent, which runs on trio.
    assert "trio" in {n for names in _closure(ROOT / "appliance/transceiver/media.py").values()
                      for n in names}


def test_the_server_only_routes() -> None:
    """Issue 27: server.py maps a datagram to its session and calls one method; the packet
    kinds' cores are the call's business, not the router's."""
    names = _imports(ROOT / "appliance/transceiver/server.py")
    banned = ("appliance.proto.dtls", "appliance.proto.sctp", "appliance.proto.rtp",
              "appliance.proto.srtp")
    bad = {n for n in names for b in banned if n == b or n.startswith(b + ".")}
    assert not bad, f"server.py imports {sorted(bad)}"
