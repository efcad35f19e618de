"""Fake transceivers and relay workers speaking the control protocol
(docs/control-protocol.md), shared by the signaling tests."""

from __future__ import annotations

from typing import Any

import trio

OFFER = (
    "v=0\r\no=- 1 2 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0\r\n"
    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\n"
    "a=ice-ufrag:abcd\r\na=ice-pwd:0123456789abcdefghijkl\r\n"
    "a=fingerprint:sha-256 00:11\r\na=setup:actpass\r\na=rtcp-mux\r\n"
    "a=rtpmap:111 opus/48000/2\r\n"
)


class FakeTransceiver:
    """Answers like a transceiver: SDP errors for offers without audio, ICE restart when the
    sdpfrag carries new credentials, sessions with a setup timeline."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.sessions: dict[str, dict[str, Any]] = {}
        self.requests: list[dict[str, Any]] = []
        self.create_error: dict[str, Any] | None = None
        self.counters = {"datagrams_in": 10, "datagrams_out": 9, "drops": {"bad_proxy": 1}}
        self.load: dict[str, Any] | None = None  # stats' "load" (headroom), when set
        #: the ``events`` long-poll's ring: what end_call() ended, as (seq, event)
        self.events: list[tuple[int, dict[str, Any]]] = []
        self._wake = trio.Event()

    def ops(self) -> list[str]:
        """The ops it was asked, in order."""
        return [r["op"] for r in self.requests]

    def end_call(self, sid: str, **fields: Any) -> None:
        """The call ends here (the caller left, the agent hung up): its session object
        updated with ``fields`` and an ``ended`` event for the ``events`` long-poll."""
        obj = self.sessions[sid]
        obj.update(state="ended", **fields)
        self.events.append((len(self.events) + 1, {
            "type": "ended", "call_id": sid, "kind": "webrtc",
            "reason": obj.get("end_reason"), "session": dict(obj)}))
        self._wake.set()
        self._wake = trio.Event()

    async def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(req)
        op = req["op"]
        sid = req.get("session_id")
        if op == "create":
            if self.create_error is not None:
                return self.create_error
            if "m=audio" not in req["offer"]:
                return {"ok": False, "status": 422, "code": "no-audio",
                        "detail": "the offer has no audio m-section"}
            assert isinstance(sid, str)
            self.sessions[sid] = {
                "id": sid, "state": "connected", "end_reason": None, "transceiver": self.k,
                "agent": req.get("agent") or "echo", "client_address": "203.0.113.7:5000",
                "codec": "opus/48000/2", "created_at": 1000.0, "ended_at": None,
                "packets_in": 5, "packets_out": 5, "bytes_in": 500, "bytes_out": 500,
                "timeline": {"offer_received": 0.0, "answer_sent": 1.5, "ice_nominated": 8.0,
                             "dtls_done": 14.0, "first_rtp_in": None, "first_rtp_out": None},
            }
            cands = "".join(
                f"a=candidate:{i} 1 udp 2130706431 {ip} {port} typ host\r\n"
                for i, (ip, port) in enumerate(req["candidates"])
            )
            return {"ok": True, "answer": f"v=0\r\na=ice-lite\r\n{cands}", "ufrag": "secret"}
        if op in ("patch", "delete", "get") and sid not in self.sessions:
            return {"ok": False, "status": 404, "code": "unknown-session", "detail": "no such"}
        if op == "patch":
            if "a=ice-ufrag:" in req["sdpfrag"]:
                return {"ok": True, "sdpfrag": "a=ice-ufrag:NEW1\r\na=ice-pwd:NEWPWDNEWPWDNEWPWDNEWPW\r\n"}
            return {"ok": True, "sdpfrag": ""}
        if op == "delete":
            assert isinstance(sid, str)
            obj = self.sessions[sid]
            if obj["state"] != "ended":  # ending is idempotent: the first reason stays
                obj.update(state="ended", end_reason=req.get("reason"), ended_at=1001.0)
            return {"ok": True, "end_reason": obj["end_reason"], "ended_at": obj["ended_at"]}
        if op == "get":
            assert isinstance(sid, str)
            return {"ok": True, "session": self.sessions[sid]}
        if op == "list":
            return {"ok": True, "sessions": list(self.sessions.values())}
        if op == "events":
            after = req.get("after") if req.get("epoch") == "fake" else 0
            if len(self.events) <= after and req.get("wait"):
                with trio.move_on_after(req["wait"]):
                    await self._wake.wait()
            return {"ok": True, "epoch": "fake", "next": len(self.events),
                    "events": [dict(ev, seq=seq) for seq, ev in self.events if seq > after],
                    "live": [s for s, o in self.sessions.items() if o["state"] != "ended"]}
        if op == "stats":
            by_state: dict[str, int] = {}
            for s in self.sessions.values():
                by_state[s["state"]] = by_state.get(s["state"], 0) + 1
            out = {"ok": True, "transceiver": self.k, "counters": self.counters,
                   "sessions_by_state": by_state}
            if self.load is not None:
                out["load"] = self.load
            return out
        return {"ok": False, "status": 400, "code": "unknown-op", "detail": op}


class FakeRelay:
    async def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        if req["op"] == "stats":
            return {"ok": True, "worker": 0, "flows": 3,
                    "counters": {"packets_in": 100, "drops": {"bad_mac": 2}}}
        return {"ok": False, "status": 400, "code": "unknown-op", "detail": req["op"]}


class FakeClock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


