"""Loading what an agent spec names: ``module:attr`` or ``path/file.py:attr``.

Below :mod:`.registry` and everything that resolves specs on its behalf (the realtime
agent's ``realtime:<spec>``, appliance/realtime/agent.py), so they share one loader without
importing each other.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

__all__ = ["AgentError", "import_target"]


class AgentError(ValueError):
    """The agent spec names nothing runnable."""


def import_target(target: str, spec: str) -> Any:
    """The object ``target`` names (``module:attr`` or ``file.py:attr``), or AgentError."""
    module_name, _, attr = target.rpartition(":")
    if not module_name or not attr:
        raise AgentError(f"agent {spec!r}: expected 'module:attr' or 'path/file.py:attr'")
    if module_name.endswith(".py"):
        module = _load_file(module_name, spec)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise AgentError(f"agent {spec!r}: cannot import {module_name!r}: {exc}") from None
        except Exception as exc:  # the module itself failed while importing
            raise AgentError(f"agent {spec!r}: {module_name} failed to load: {exc!r}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AgentError(f"agent {spec!r}: {module_name!r} has no {attr!r}") from None
    return obj


def _load_file(path: str, spec: str) -> Any:
    """Import a ``.py`` file (``--agent examples/echo.py:echo``), once per resolved path."""
    full = Path(path).resolve()
    name = "appliance_agent_" + hashlib.sha1(str(full).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    if not full.is_file():
        raise AgentError(f"agent {spec!r}: no such file {path!r}")
    loader_spec = importlib.util.spec_from_file_location(name, full)
    if loader_spec is None or loader_spec.loader is None:
        raise AgentError(f"agent {spec!r}: cannot load {path!r}")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise AgentError(f"agent {spec!r}: {path} failed to load: {exc!r}") from None
    return module
