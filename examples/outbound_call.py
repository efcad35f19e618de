"""Place a phone call through a SIP trunk and follow it to its end (docs/sip.md "Outbound
calls").

    appliance up --sip 0.0.0.0:5060 --sip-trunks trunks.toml --agent examples/parrot.py:Parrot &
    APPLIANCE_API_TOKEN=... python examples/outbound_call.py --to +15551234567 --trunk twilio

It uses the official ``openai`` SDK's client for its base URL, key and retries, with the
appliance's own route (``POST /v1/realtime/calls/sip``; OpenAI has no outbound call API),
then polls ``GET /v1/realtime/calls/{id}`` and prints each change of status. With
``--hangup-after S`` it hangs up S seconds after the callee answers (``POST …/hangup``);
otherwise the call runs until the callee or the agent hangs up. Exit status 0 when the call
was answered, 1 when it failed (the failure's code and SIP status are printed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from openai import OpenAI


def follow_call(client: OpenAI, to: str, *, trunk: str | None = None, agent: str | None = None,
                instructions: str | None = None, hangup_after: float | None = None,
                poll: float = 0.25, timeout: float = 3600.0,
                say: Any = print) -> dict[str, Any]:
    """Place the call, follow it until it is ``ended`` or ``failed``; returns the last view
    (``answered_at`` added: when it became active, or None)."""
    body: dict[str, Any] = {"to": to, "session": {"type": "realtime"}}
    if trunk:
        body["trunk"] = trunk
    if agent:
        body["agent"] = agent
    if instructions:
        body["session"]["instructions"] = instructions
    call: Any = client.post("/realtime/calls/sip", body=body, cast_to=object)
    say(f"{call['id']}: {call['status']} {to}")
    status, answered_at = call["status"], None
    deadline = time.monotonic() + timeout
    while status not in ("ended", "failed") and time.monotonic() < deadline:
        time.sleep(poll)
        call = client.get(f"/realtime/calls/{call['id']}", cast_to=object)
        if call["status"] != status:
            status = call["status"]
            say(f"{call['id']}: {status}" + (f" ({call['progress']})" if status == "ringing"
                                             and call.get("progress") else ""))
            if status == "active":
                answered_at = time.monotonic()
        if (status == "active" and hangup_after is not None and answered_at is not None
                and time.monotonic() - answered_at >= hangup_after):
            client.post(f"/realtime/calls/{call['id']}/hangup", cast_to=object)
            hangup_after = None  # once
    call["answered_at"] = answered_at
    if call["status"] == "failed" and call.get("failure"):
        f = call["failure"]
        say(f"{call['id']}: failed: {f['code']} ({f['status_code']} {f['reason']})")
    elif call["status"] == "ended":
        say(f"{call['id']}: ended by {call.get('hung_up_by')} ({call.get('end_reason')})")
    return dict(call)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base-url", default=os.environ.get("APPLIANCE_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--to", required=True, help="a number, or a sip:/tel: URI")
    ap.add_argument("--trunk", help="a trunk's name in --sip-trunks (optional with one)")
    ap.add_argument("--agent", help="the agent spec for this call (default: the deployment's)")
    ap.add_argument("--instructions", help="the Realtime session's instructions")
    ap.add_argument("--hangup-after", type=float, help="hang up this many seconds after the answer")
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url.rstrip("/") + "/v1",
                    api_key=os.environ.get("APPLIANCE_API_TOKEN", "unused-on-loopback"))
    call = follow_call(client, args.to, trunk=args.trunk, agent=args.agent,
                       instructions=args.instructions, hangup_after=args.hangup_after)
    return 0 if call["answered_at"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
