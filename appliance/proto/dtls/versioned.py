""":class:`DtlsConnection`: one DTLS association, 1.2 (RFC 6347) or 1.3 (RFC 9147).

The caller-facing class. ``versions`` says what may be negotiated; the default is
``{"1.2"}`` (nothing changes for callers until they opt in). With ``"1.3"`` in it:

* **Server**: the 1.3 engine reads the ClientHello (reassembling its fragments). With
  ``supported_versions`` listing DTLS 1.3 (0xfefc) it answers 1.3 (RFC 8446 §4.2.1);
  otherwise, if ``"1.2"`` is enabled, the datagrams seen so far are replayed into a fresh
  1.2 engine, whose ServerHello.random ends in the RFC 8446 §4.1.3 sentinel
  ``DOWNGRD\\x01`` (a 1.3-capable server negotiating 1.2).
* **Server** with ``half_rtt`` (opt-in, off by default): a 1.3 handshake reports
  ``FalseStart`` once its flight is sent and the exporter works from then on (0.5-RTT data,
  RFC 8446 §4.4.4 — to a client not yet authenticated); a 1.2 one ignores it.
* **Client**: sends one ClientHello that offers 1.3 (and, with ``"1.2"`` enabled, what a
  1.2 server needs: 1.2 suites, extended_master_secret, renegotiation_info,
  ec_point_formats). A 1.2 ServerHello or a HelloVerifyRequest hands over to the 1.2
  engine with that ClientHello as its flight 1; the 1.2 engine then refuses a
  ServerHello.random carrying a downgrade sentinel (RFC 8446 §4.1.3).

The engines share events, certificates, fingerprint checks, alerts and the Reader.
``HandshakeComplete.version`` and :attr:`DtlsConnection.version` say what was agreed.
For a ``--dtls-versions 1.2,1.3`` flag: ``versions=parse_versions(flag_value)``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from appliance.proto.dtls._wire import (
    EC_POINT_FORMAT_UNCOMPRESSED,
    CipherSuite,
    ExtensionType,
    NamedGroup,
)
from appliance.proto.dtls._wire13 import (
    DOWNGRADE_TLS12,
    VERSION_NAMES,
    CipherSuite13,
    Group13,
    parse_versions,
)
from appliance.proto.dtls.certificate import Certificate
from appliance.proto.dtls.connection import (
    DEFAULT_CIPHER_SUITES,
    DEFAULT_GROUPS,
    DEFAULT_INITIAL_RTO,
    Dtls12Connection,
)
from appliance.proto.dtls.connection13 import DEFAULT_CIPHER_SUITES_13, Dtls13Connection
from appliance.proto.dtls.events import Counters, Event, Role, State
from appliance.proto.errors import LocalProtocolError
from appliance.proto.srtp.profile import DEFAULT_SRTP_PROFILES, SrtpProfile

__all__ = ["DEFAULT_VERSIONS", "DtlsConnection", "parse_versions"]

#: The constructor default: DTLS 1.2 only, until browser interop of 1.3 is signed off.
DEFAULT_VERSIONS: frozenset[str] = frozenset({"1.2"})


class DtlsConnection:
    """One DTLS association with one peer; see the module docstring for negotiation and
    :mod:`.connection` for the verbs (``handle_datagram``/``poll_*``/``handle_timeout``)."""

    def __init__(
        self,
        role: Role,
        certificate: Certificate,
        *,
        remote_fingerprints: Sequence[str] | None,
        srtp_profiles: Sequence[SrtpProfile] = DEFAULT_SRTP_PROFILES,
        cipher_suites: Sequence[CipherSuite] = DEFAULT_CIPHER_SUITES,
        groups: Sequence[NamedGroup] = DEFAULT_GROUPS,
        cookie_secret: bytes | None = None,
        cookie_context: bytes = b"",
        mtu: int = 1200,
        max_handshake_buffer: int = 32 * 1024,
        initial_retransmit: float = DEFAULT_INITIAL_RTO,
        max_retransmissions: int = 10,
        rng: Callable[[int], bytes] = os.urandom,
        false_start: bool = False,
        versions: frozenset[str] = DEFAULT_VERSIONS,
        cipher_suites_13: Sequence[CipherSuite13] = DEFAULT_CIPHER_SUITES_13,
        groups_13: Sequence[Group13] | None = None,
        half_rtt: bool = False,
    ) -> None:
        versions = frozenset(versions)
        if not versions or not versions <= VERSION_NAMES:
            raise LocalProtocolError(f"versions must be a non-empty subset of {sorted(VERSION_NAMES)}")
        self.versions = versions
        self._kw12: dict[str, object] = dict(
            remote_fingerprints=remote_fingerprints, srtp_profiles=srtp_profiles,
            cipher_suites=cipher_suites, groups=groups, cookie_secret=cookie_secret,
            cookie_context=cookie_context, mtu=mtu, max_handshake_buffer=max_handshake_buffer,
            initial_retransmit=initial_retransmit, max_retransmissions=max_retransmissions,
            rng=rng, false_start=false_start,
        )
        self._role = role
        self._certificate = certificate
        self._impl: Dtls12Connection | Dtls13Connection
        if "1.3" not in versions:
            self._impl = Dtls12Connection(role, certificate, **self._kw12)  # type: ignore[arg-type]
            return
        with_12 = "1.2" in versions
        if with_12:
            # Validate the 1.2 options now, not on a later fallback.
            Dtls12Connection(role, certificate, **self._kw12)  # type: ignore[arg-type]
        hello_12: tuple[tuple[int, ...], tuple[tuple[int, bytes], ...]] = ((), ())
        if with_12 and role is Role.CLIENT:
            # What the 1.2 engine's own ClientHello carries besides the shared extensions
            # (messages.py / handshake12_client.py client_hello_out), so a 1.2 server can accept.
            hello_12 = (tuple(int(s) for s in cipher_suites), (
                (ExtensionType.ec_point_formats, bytes((1, EC_POINT_FORMAT_UNCOMPRESSED))),
                (ExtensionType.extended_master_secret, b""),
                (ExtensionType.renegotiation_info, b"\x00"),
            ))
        self._impl = Dtls13Connection(
            role, certificate, remote_fingerprints=remote_fingerprints,
            srtp_profiles=srtp_profiles, cipher_suites=cipher_suites_13, groups=groups_13,
            cookie_secret=cookie_secret, cookie_context=cookie_context, mtu=mtu,
            max_handshake_buffer=max_handshake_buffer, initial_retransmit=initial_retransmit,
            max_retransmissions=max_retransmissions, rng=rng, fallback_12=with_12,
            hello_12=hello_12, half_rtt=half_rtt,
        )

    # --- version handover -------------------------------------------------------------

    def _fall_back(self, now: float, impl: Dtls13Connection) -> None:
        """The peer speaks only 1.2: continue with the 1.2 engine (module docstring)."""
        assert impl.fallback is not None
        kw = dict(self._kw12)
        if self._role is Role.SERVER:
            kw.update(cookie_secret=impl._cookie_secret, cookie_context=impl._cookie_context)
        e12 = Dtls12Connection(self._role, self._certificate, **kw)  # type: ignore[arg-type]
        e12.counters = impl.counters
        datagrams = impl.fallback
        if self._role is Role.SERVER:
            e12.downgrade_sentinel = DOWNGRADE_TLS12
        else:
            assert impl.fallback_hello is not None
            e12.adopt_client_hello(now, impl.fallback_hello, impl.rl.next_seq0)
        self._impl = e12
        for datagram in datagrams:
            e12.handle_datagram(now, datagram)

    # --- the verbs, delegated ---------------------------------------------------------

    @property
    def engine(self) -> Dtls12Connection | Dtls13Connection:
        """The engine in charge (tests and metrics; callers use the verbs below)."""
        return self._impl

    @property
    def version(self) -> str | None:
        """``"1.2"`` or ``"1.3"`` once negotiated; None while undecided."""
        impl = self._impl
        if isinstance(impl, Dtls12Connection):
            return "1.2" if ("1.3" not in self.versions or impl.cipher_suite is not None) else None
        return "1.3" if impl.cipher_suite is not None else None

    @property
    def role(self) -> Role:
        return self._role

    @property
    def certificate(self) -> Certificate:
        return self._certificate

    @property
    def mtu(self) -> int:
        return self._impl.mtu

    @property
    def counters(self) -> Counters:
        return self._impl.counters

    @property
    def state(self) -> State:
        return self._impl.state

    @property
    def is_established(self) -> bool:
        return self._impl.is_established

    @property
    def cipher_suite(self) -> CipherSuite | CipherSuite13 | None:
        return self._impl.cipher_suite

    @property
    def srtp_profile(self) -> SrtpProfile | None:
        return self._impl.srtp_profile

    @property
    def max_application_data(self) -> int:
        return self._impl.max_application_data

    @property
    def awaiting_client_hello(self) -> bool:
        return self._impl.awaiting_client_hello

    @property
    def cookies_required(self) -> bool:
        return self._impl.cookies_required

    def require_cookies(self, secret: bytes | None, context: bytes = b"") -> None:
        self._impl.require_cookies(secret, context)
        self._kw12.update(cookie_secret=secret, cookie_context=context)

    def start(self, now: float) -> None:
        self._impl.start(now)

    def handle_datagram(self, now: float, data: bytes) -> None:
        impl = self._impl
        impl.handle_datagram(now, data)
        if isinstance(impl, Dtls13Connection) and impl.fallback is not None:
            self._fall_back(now, impl)

    def handle_timeout(self, now: float) -> None:
        self._impl.handle_timeout(now)

    def poll_timeout(self) -> float | None:
        return self._impl.poll_timeout()

    def poll_transmit(self) -> bytes | None:
        return self._impl.poll_transmit()

    def poll_event(self) -> Event | None:
        return self._impl.poll_event()

    def send_application_data(self, data: bytes) -> None:
        self._impl.send_application_data(data)

    def key_update(self, now: float, *, request_peer: bool = True) -> None:
        """DTLS 1.3 only (RFC 8446 §4.6.3); a 1.2 association cannot rekey."""
        if not isinstance(self._impl, Dtls13Connection):
            raise LocalProtocolError("KeyUpdate needs DTLS 1.3")
        self._impl.key_update(now, request_peer=request_peer)

    def close(self) -> None:
        self._impl.close()

    def export_keying_material(self, label: bytes, length: int) -> bytes:
        return self._impl.export_keying_material(label, length)

