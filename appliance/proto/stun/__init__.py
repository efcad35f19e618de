"""STUN (RFC 8489, RFC 5389) for ICE and TURN: a sans-IO codec, Binding builders and the
relay's hot-path helpers.

* ``message``  — ``Message`` codec, attribute registry (the TURN attributes of RFC 8656
  included: one parser for both), MESSAGE-INTEGRITY / MESSAGE-INTEGRITY-SHA256 /
  FINGERPRINT, long-term credential keys (RFC 8489 §5, §9, §14).
* ``builders`` — Binding request / success / error as ICE uses them (RFC 8445 §7).
* ``fast``     — ``peek_username_untrusted`` and ``reflexive_response`` for the relay.

Every ``*_untrusted`` function raises only ``StunError``; the ``verify_*`` functions never
raise and return ``False`` for anything malformed.
"""

from __future__ import annotations

from appliance.proto.stun.builders import (
    ERROR_REASONS,
    binding_error,
    binding_request,
    binding_success,
)
from appliance.proto.stun.fast import (
    MAX_AMPLIFICATION,
    peek_username_untrusted,
    reflexive_response,
)
from appliance.proto.stun.message import (
    ATTRIBUTES,
    COOKIE,
    HEADER_LENGTH,
    Addr,
    AttrType,
    AttrValue,
    Class,
    Message,
    Method,
    PasswordAlgorithm,
    StunError,
    encode_password_algorithms,
    find_attribute,
    fingerprint_value,
    long_term_key,
    message_integrity,
    message_integrity_sha256,
    parse_password_algorithm_untrusted,
    saslprep,
    verify_fingerprint,
    verify_integrity,
    verify_integrity_sha256,
)

__all__ = [
    "ATTRIBUTES",
    "COOKIE",
    "ERROR_REASONS",
    "HEADER_LENGTH",
    "MAX_AMPLIFICATION",
    "Addr",
    "AttrType",
    "AttrValue",
    "Class",
    "Message",
    "Method",
    "PasswordAlgorithm",
    "StunError",
    "binding_error",
    "binding_request",
    "binding_success",
    "encode_password_algorithms",
    "find_attribute",
    "fingerprint_value",
    "long_term_key",
    "message_integrity",
    "message_integrity_sha256",
    "parse_password_algorithm_untrusted",
    "peek_username_untrusted",
    "reflexive_response",
    "saslprep",
    "verify_fingerprint",
    "verify_integrity",
    "verify_integrity_sha256",
]
