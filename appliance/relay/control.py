"""The relay's control channel: ``{"op": "stats"}`` for one worker, and for M workers summed.

A worker serves its own counters (:func:`worker_handler`); the M-worker parent of
``appliance relay --workers M`` asks each worker and sums them (:func:`merged_stats`). The
reply shape is what signaling's metrics read (``counters``, ``flows``, ``drops`` by reason,
``io``), so it must not change.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from ..control import ControlError, control_request
from ..netio.sockets import format_addr
from .core import RelayCore

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def unknown_op(req: Mapping[str, Any]) -> dict[str, Any]:
    return {"ok": False, "status": 400, "code": "unknown-op",
            "detail": f"unknown op {req.get('op')!r}; this relay serves 'stats'"}


def worker_handler(core: RelayCore, worker: int, io: str,
                   sockets: Mapping[str, Any]) -> Handler:
    """The control handler of one worker."""

    async def handle(req: dict[str, Any]) -> dict[str, Any]:
        if req.get("op") != "stats":
            return unknown_op(req)
        return {
            "ok": True,
            "counters": core.counters.as_dict(),
            "flows": len(core.flows),
            "worker": worker,
            "pid": os.getpid(),
            "io": io,
            "sockets": sockets,
            "transceivers": {str(k): format_addr(a)
                             for k, a in sorted(core.transceivers.items())},
        }

    return handle


async def merged_stats(controls: Sequence[str]) -> dict[str, Any]:
    """Ask every worker (by control address) and sum their counters; a worker that does
    not answer is reported, not fatal."""
    per: list[dict[str, Any]] = []
    total: dict[str, Any] = {"drops": {}}
    flows = 0
    for i, control in enumerate(controls):
        try:
            resp = await control_request(control, {"op": "stats"})
        except ControlError as exc:
            per.append({"ok": False, "worker": i, "detail": str(exc)})
            continue
        per.append(resp)
        flows += int(resp.get("flows", 0))
        for key, value in resp.get("counters", {}).items():
            if key == "drops":
                for reason, n in value.items():
                    total["drops"][reason] = total["drops"].get(reason, 0) + n
            else:
                total[key] = total.get(key, 0) + value
    io = ",".join(sorted({str(r["io"]) for r in per if "io" in r}))
    return {"ok": True, "counters": total, "flows": flows, "worker": "all",
            "workers": per, "io": io}
