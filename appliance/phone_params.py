"""The leg options of a phone ``create`` control op (``phone``): the one definition of the
JSON shape signaling sends a transceiver to run a phone call's media (STYLE.md rule 15).

::

    {"call_id": "rtc_sip_…", "agent": "echo", "session": {…},
     "codec": "PCMU" | "PCMA" | "opus", "payload_type": 0, "clock_rate": 8000,
     "dtmf_payload_type": 101 | null, "direction": "sendrecv",
     "remote": ["203.0.113.5", 40000], "rtcp_mux": false, "remote_rtcp": [ip, port] | null,
     "trunk_ip": "203.0.113.5",
     "srtp": null | {"suite": "AES_CM_128_HMAC_SHA1_80",
                     "local": "<base64 key||salt we protect with>",
                     "remote": "<base64 key||salt the trunk protects with>"}}

``trunk_ip`` is where the call's SIP came from: the relay's vouch rule accepts RTP from it
on any port (docs/adr-sip-media.md, NAT). The SRTP keys cross the control channel as the
WebRTC path's SDP does; the channel is a Unix socket or a private network (docs/security.md).
Signaling builds it (``signaling/phone_media.py``), the transceiver reads it
(``transceiver/phone.py``); :meth:`PhoneParams.from_json_untrusted` raises only ValueError.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from dataclasses import dataclass, field
from typing import Any

CODECS = {"PCMU": 8000, "PCMA": 8000, "opus": 48000}
DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")


@dataclass(frozen=True, slots=True)
class SrtpParams:
    suite: str
    local: bytes = field(repr=False)
    remote: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class PhoneParams:
    call_id: str
    agent: str
    session: dict[str, Any]
    codec: str
    payload_type: int
    clock_rate: int
    dtmf_payload_type: int | None
    direction: str
    remote: tuple[str, int]
    rtcp_mux: bool
    remote_rtcp: tuple[str, int] | None
    trunk_ip: str
    srtp: SrtpParams | None = None

    def to_json(self) -> dict[str, Any]:
        b64 = base64.b64encode
        return {
            "call_id": self.call_id, "agent": self.agent, "session": self.session,
            "codec": self.codec, "payload_type": self.payload_type,
            "clock_rate": self.clock_rate, "dtmf_payload_type": self.dtmf_payload_type,
            "direction": self.direction, "remote": list(self.remote),
            "rtcp_mux": self.rtcp_mux,
            "remote_rtcp": list(self.remote_rtcp) if self.remote_rtcp else None,
            "trunk_ip": self.trunk_ip,
            "srtp": None if self.srtp is None else {
                "suite": self.srtp.suite, "local": b64(self.srtp.local).decode(),
                "remote": b64(self.srtp.remote).decode()},
        }

    @classmethod
    def from_json_untrusted(cls, obj: object) -> PhoneParams:
        if not isinstance(obj, dict):
            raise ValueError("phone params must be an object")
        codec = _str(obj, "codec")
        if codec not in CODECS:
            raise ValueError(f"codec must be one of {', '.join(CODECS)}")
        direction = _str(obj, "direction")
        if direction not in DIRECTIONS:
            raise ValueError("direction must be sendrecv, sendonly, recvonly or inactive")
        session = obj.get("session", {})
        if not isinstance(session, dict):
            raise ValueError("session must be an object")
        dtmf = obj.get("dtmf_payload_type")
        srtp_in = obj.get("srtp")
        srtp = None
        if srtp_in is not None:
            if not isinstance(srtp_in, dict):
                raise ValueError("srtp must be an object or null")
            srtp = SrtpParams(_str(srtp_in, "suite"), _b64(srtp_in, "local"),
                              _b64(srtp_in, "remote"))
        rtcp = obj.get("remote_rtcp")
        return cls(
            call_id=_str(obj, "call_id"), agent=_str(obj, "agent"), session=session,
            codec=codec, payload_type=_pt(obj.get("payload_type"), "payload_type"),
            clock_rate=_int(obj.get("clock_rate"), "clock_rate", 8000, 48000),
            dtmf_payload_type=None if dtmf is None else _pt(dtmf, "dtmf_payload_type"),
            direction=direction, remote=_addr(obj.get("remote"), "remote"),
            rtcp_mux=bool(obj.get("rtcp_mux")),
            remote_rtcp=None if rtcp is None else _addr(rtcp, "remote_rtcp"),
            trunk_ip=_ip(obj.get("trunk_ip"), "trunk_ip"), srtp=srtp)


def _str(obj: dict[str, Any], key: str) -> str:
    v = obj.get(key)
    if not isinstance(v, str) or not 0 < len(v) <= 256:
        raise ValueError(f"{key} must be a string of 1..256 characters")
    return v


def _int(v: object, key: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{key} must be an integer {lo}..{hi}")
    return v


def _pt(v: object, key: str) -> int:
    return _int(v, key, 0, 127)


def _ip(v: object, key: str) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{key} must be an IP address")
    try:
        return str(ipaddress.ip_address(v))
    except ValueError:
        raise ValueError(f"{key} must be an IP address") from None


def _addr(v: object, key: str) -> tuple[str, int]:
    if not isinstance(v, list | tuple) or len(v) != 2:
        raise ValueError(f"{key} must be [ip, port]")
    return _ip(v[0], key), _int(v[1], key, 0, 65535)


def _b64(obj: dict[str, Any], key: str) -> bytes:
    v = obj.get(key)
    if not isinstance(v, str) or len(v) > 128:
        raise ValueError(f"srtp.{key} must be base64")
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"srtp.{key} must be base64") from None
