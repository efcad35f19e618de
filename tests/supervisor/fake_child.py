"""A stand-in for ``python -m appliance ROLE``: serves the control protocol, prints the
role's ready line, and records itself for the tests.

Environment:
* ``FAKE_CHILD_DIR``: write ``<role>-<id>-<pid>.json`` (argv) there on start;
* ``FAKE_CHILD_MODE``: comma-separated behaviours: ``ignore-term`` (ignore SIGTERM),
  ``never-ready[:ROLE]`` (exit 3 at once), ``exit-after-ready[:ROLE]`` (exit 4 right after the
  ready line), ``grandchild`` (spawn a sleeping grandchild in the same process group and
  record its pid).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from appliance.control import serve_control


def mode(name: str, role: str) -> bool:
    for item in os.environ.get("FAKE_CHILD_MODE", "").split(","):
        what, _, only = item.partition(":")
        if what == name and (not only or only == role):
            return True
    return False


def main() -> None:
    role = sys.argv[1]
    if "--standby" in sys.argv and sys.stdin.readline().strip() != "go":
        return  # a warm standby the supervisor never needed (appliance.children)
    p = argparse.ArgumentParser()
    p.add_argument("--id", default="0")
    p.add_argument("--listen")
    p.add_argument("--control")
    p.add_argument("--transceiver", action="append")
    args, _ = p.parse_known_args(sys.argv[2:])
    key = args.id if role == "transceiver" else Path(args.control).stem.split("-")[-1]
    record: dict[str, Any] = {"role": role, "id": key, "pid": os.getpid(), "argv": sys.argv[1:]}
    if mode("ignore-term", role):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode("grandchild", role):
        gc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        record["grandchild"] = gc.pid
    out = os.environ.get("FAKE_CHILD_DIR")
    if out:
        Path(out, f"{role}-{key}-{os.getpid()}.json").write_text(json.dumps(record))
    if mode("never-ready", role):
        os._exit(3)
    trio.run(serve, role, key, args)


async def serve(role: str, key: str, args: argparse.Namespace) -> None:
    sessions: dict[str, dict[str, Any]] = {}

    async def handle(req: dict[str, Any]) -> dict[str, Any]:
        op, sid = req["op"], req.get("session_id")
        if op == "stats":
            if role == "relay":
                return {"ok": True, "worker": key, "flows": 0, "counters": {"packets_in": 0}}
            return {"ok": True, "transceiver": int(key), "counters": {"datagrams_in": 0},
                    "sessions_by_state": {"connected": len(sessions)}}
        if role == "transceiver" and op == "create":
            assert isinstance(sid, str)
            sessions[sid] = {"id": sid, "state": "connected", "transceiver": int(key),
                             "timeline": {}}
            return {"ok": True, "answer": f"v=0\r\na=x-transceiver:{key}\r\n", "ufrag": "u"}
        if role == "transceiver" and op == "list":
            return {"ok": True, "sessions": list(sessions.values())}
        if role == "transceiver" and op == "get" and sid in sessions:
            return {"ok": True, "session": sessions[sid]}
        return {"ok": False, "status": 404, "code": "unknown-session", "detail": "fake"}

    async with trio.open_nursery() as nursery:
        control = await nursery.start(serve_control, args.control, handle)
        if role == "transceiver":
            print(f"transceiver {key} listening on {args.listen} control {control}", flush=True)
        else:
            print(f"relay listening on {args.listen} internal 127.0.0.1:1", flush=True)
        if mode("exit-after-ready", role):
            os._exit(4)


if __name__ == "__main__":
    main()
