"""Builders for the Binding messages ICE exchanges (RFC 8445 §7.1, §7.3; RFC 8489 §6.3).

Short-term credentials (RFC 8489 §9.1): the MESSAGE-INTEGRITY key is the password itself,
UTF-8 encoded; requests are signed with the *remote* password, responses with the *local*
one (RFC 8445 §7.2.2, §7.3). Every message carries FINGERPRINT (RFC 8445 §7: STUN shares a
5-tuple with DTLS and RTP).

Deliberately omitted: SOFTWARE (fingerprints the server for no benefit) and
MESSAGE-INTEGRITY-SHA256 (no WebRTC stack sends it for ICE).
"""

from __future__ import annotations

from appliance.proto.errors import LocalProtocolError
from appliance.proto.stun.message import (
    Addr,
    AttrType,
    AttrValue,
    Class,
    Message,
    Method,
)

__all__ = ["ERROR_REASONS", "binding_error", "binding_request", "binding_success"]

#: Reason phrases of the error codes we send (RFC 8489 §14.8, RFC 8445 §16.1).
ERROR_REASONS: dict[int, str] = {
    400: "Bad Request",
    401: "Unauthorized",
    420: "Unknown Attribute",
    487: "Role Conflict",
    500: "Server Error",
}


def binding_request(
    transaction_id: bytes,
    *,
    username: str | None = None,
    password: str | None = None,
    priority: int | None = None,
    controlling: int | None = None,
    controlled: int | None = None,
    use_candidate: bool = False,
    fingerprint: bool = True,
) -> bytes:
    """An ICE connectivity check (RFC 8445 §7.1.1-§7.1.3); with no credentials, a plain
    discovery request. ``controlling``/``controlled`` carry the 64-bit tie-breaker."""
    if controlling is not None and controlled is not None:
        raise LocalProtocolError("an agent is either controlling or controlled")
    attrs: list[tuple[AttrType, AttrValue]] = []
    if username is not None:
        attrs.append((AttrType.USERNAME, username))
    if priority is not None:
        attrs.append((AttrType.PRIORITY, priority))
    if controlling is not None:
        attrs.append((AttrType.ICE_CONTROLLING, controlling))
    if controlled is not None:
        attrs.append((AttrType.ICE_CONTROLLED, controlled))
    if use_candidate:
        attrs.append((AttrType.USE_CANDIDATE, None))
    msg = Message(Method.BINDING, Class.REQUEST, transaction_id, tuple(attrs))
    key = password.encode("utf-8") if password is not None else None
    return msg.encode(integrity_key=key, fingerprint=fingerprint)


def binding_success(
    transaction_id: bytes, mapped: Addr, *, integrity_key: bytes | None = None
) -> bytes:
    """Success response with XOR-MAPPED-ADDRESS = ``mapped`` (RFC 8445 §7.3.1.2)."""
    msg = Message(
        Method.BINDING,
        Class.SUCCESS,
        transaction_id,
        ((AttrType.XOR_MAPPED_ADDRESS, mapped),),
    )
    return msg.encode(integrity_key=integrity_key)


def binding_error(
    transaction_id: bytes,
    code: int,
    reason: str | None = None,
    *,
    integrity_key: bytes | None = None,
    unknown_attributes: tuple[int, ...] = (),
) -> bytes:
    """Error response (RFC 8489 §6.3.4). A 401 must not carry MESSAGE-INTEGRITY (the
    requester's key is not trusted, §9.1.3), so pass ``integrity_key`` only for errors to
    authenticated requests (e.g. 487, 420)."""
    if reason is None:
        reason = ERROR_REASONS.get(code, "")
    attrs: list[tuple[AttrType, AttrValue]] = [(AttrType.ERROR_CODE, (code, reason))]
    if unknown_attributes:
        attrs.append((AttrType.UNKNOWN_ATTRIBUTES, unknown_attributes))
    msg = Message(Method.BINDING, Class.ERROR, transaction_id, tuple(attrs))
    return msg.encode(integrity_key=integrity_key)
