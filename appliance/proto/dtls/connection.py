""":class:`DtlsConnection`: one DTLS association, 1.2 (RFC 6347) or 1.3 (RFC 9147).

The caller-facing class, and the only one: it owns the shared pieces (role, certificate,
counters, the version choice) and one handshake engine at a time,
:class:`~.engine12.Engine12` or :class:`~.engine13.Engine13`, both
:class:`~.engine.Engine` (the shared verbs, timers, closing) over one record-layer
interface (:class:`~.recordlayer.RecordLayer`). ``versions`` says what may be negotiated;
the default is ``{"1.2"}``. With ``"1.3"`` in it:

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

``HandshakeComplete.version`` and :attr:`DtlsConnection.version` say what was agreed.
For a ``--dtls-versions 1.2,1.3`` flag: ``versions=parse_versions(flag_value)``.

Verbs (docs/style.md rule 18): ``handle_input(now, data)``, ``poll_output()`` until None
(:class:`~.events.Transmit` datagrams first, then events), ``poll_timeout()``,
``handle_timeout(now)``; user operations ``start``, ``send_application_data``,
``key_update``, ``close``, ``export_keying_material``. ``handle_datagram``,
``poll_transmit`` and ``poll_event`` are the older spellings of the same verbs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace

from appliance.proto.dtls._wire import (
    DOWNGRADE_TLS12,
    EC_POINT_FORMAT_UNCOMPRESSED,
    VERSION_NAMES,
    CipherSuite,
    CipherSuite13,
    ExtensionType,
    Group13,
    NamedGroup,
    parse_versions,
)
from appliance.proto.dtls.certificate import Certificate
from appliance.proto.dtls.engine import DEFAULT_INITIAL_RTO, Options
from appliance.proto.dtls.engine12 import DEFAULT_CIPHER_SUITES, DEFAULT_GROUPS, Engine12
from appliance.proto.dtls.engine13 import DEFAULT_CIPHER_SUITES_13, Engine13
from appliance.proto.dtls.events import Counters, Event, Role, State, Transmit
from appliance.proto.errors import LocalProtocolError
from appliance.proto.srtp.profile import DEFAULT_SRTP_PROFILES, SrtpProfile

__all__ = ["DEFAULT_VERSIONS", "Connection", "DtlsConnection", "parse_versions"]

#: The constructor default: DTLS 1.2 only, until browser interop of 1.3 is signed off.
DEFAULT_VERSIONS: frozenset[str] = frozenset({"1.2"})


class DtlsConnection:
    """One DTLS association with one peer; see the module docstring."""

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
        self.role = role
        self.certificate = certificate
        self.counters = Counters()
        self._options = Options(
            remote_fingerprints, srtp_profiles, cookie_secret, cookie_context, mtu,
            max_handshake_buffer, initial_retransmit, max_retransmissions, rng)
        self._suites_12, self._groups_12, self._false_start = cipher_suites, groups, false_start
        #: The engine in charge (tests and metrics; callers use the verbs).
        self.engine: Engine12 | Engine13
        if "1.3" not in versions:
            self.engine = self._engine12(self._options)
            return
        with_12 = "1.2" in versions
        if with_12:
            self._engine12(self._options)  # validate the 1.2 options now, not on a fallback
        hello_12: tuple[tuple[int, ...], tuple[tuple[int, bytes], ...]] = ((), ())
        if with_12 and role is Role.CLIENT:
            # What the 1.2 engine's own ClientHello carries besides the shared extensions
            # (handshake12_client.client_hello_out), so a 1.2 server can accept.
            hello_12 = (tuple(int(s) for s in cipher_suites), (
                (ExtensionType.ec_point_formats, bytes((1, EC_POINT_FORMAT_UNCOMPRESSED))),
                (ExtensionType.extended_master_secret, b""),
                (ExtensionType.renegotiation_info, b"\x00"),
            ))
        self.engine = Engine13(
            role, certificate, self._options, cipher_suites=cipher_suites_13, groups=groups_13,
            fallback_12=with_12, hello_12=hello_12, half_rtt=half_rtt, counters=self.counters,
        )

    def _engine12(self, options: Options) -> Engine12:
        return Engine12(self.role, self.certificate, options, cipher_suites=self._suites_12,
                        groups=self._groups_12, false_start=self._false_start,
                        counters=self.counters)

    def _fall_back(self, now: float, e13: Engine13) -> None:
        """The peer speaks only 1.2: continue with the 1.2 engine (module docstring)."""
        options = self._options
        if self.role is Role.SERVER:
            options = replace(options, cookie_secret=e13._cookie_secret,
                              cookie_context=e13._cookie_context)
        e12 = self._engine12(options)
        datagrams = e13.fallback or []
        if self.role is Role.SERVER:
            e12.downgrade_sentinel = DOWNGRADE_TLS12
        else:
            assert e13.fallback_hello is not None
            e12.adopt_client_hello(now, e13.fallback_hello, e13.rl.next_seq0)
        self.engine = e12
        for datagram in datagrams:
            e12.handle_input(now, datagram)

    # --- what was agreed --------------------------------------------------------------

    @property
    def version(self) -> str | None:
        """``"1.2"`` or ``"1.3"`` once negotiated; None while undecided."""
        engine = self.engine
        if isinstance(engine, Engine12):
            return "1.2" if ("1.3" not in self.versions or engine.cipher_suite is not None) else None
        return "1.3" if engine.cipher_suite is not None else None

    @property
    def state(self) -> State:
        return self.engine.state

    @property
    def is_established(self) -> bool:
        return self.engine.is_established

    @property
    def cipher_suite(self) -> CipherSuite | CipherSuite13 | None:
        return self.engine.cipher_suite

    @property
    def srtp_profile(self) -> SrtpProfile | None:
        return self.engine.srtp_profile

    @property
    def mtu(self) -> int:
        return self.engine.mtu

    @property
    def max_application_data(self) -> int:
        return self.engine.max_application_data

    @property
    def awaiting_client_hello(self) -> bool:
        return self.engine.awaiting_client_hello

    @property
    def cookies_required(self) -> bool:
        return self.engine.cookies_required

    def require_cookies(self, secret: bytes | None, context: bytes = b"") -> None:
        """See :meth:`.engine.Engine.require_cookies`; a later 1.2 fallback keeps them."""
        self.engine.require_cookies(secret, context)
        self._options = replace(self._options, cookie_secret=secret, cookie_context=context)

    # --- the verbs --------------------------------------------------------------------

    def handle_input(self, now: float, data: bytes) -> None:
        """Feed one UDP payload. Never raises for bad peer bytes: they are dropped or end
        the connection with an alert (reported as a ``ConnectionClosed`` event)."""
        engine = self.engine
        engine.handle_input(now, data)
        if isinstance(engine, Engine13) and engine.fallback is not None:
            self._fall_back(now, engine)

    def poll_output(self) -> Transmit | Event | None:
        """The next datagram to send, else the next event; None when there is neither."""
        data = self.engine.poll_transmit()
        if data is not None:
            return Transmit(data)
        return self.engine.poll_event()

    def poll_timeout(self) -> float | None:
        return self.engine.poll_timeout()

    def handle_timeout(self, now: float) -> None:
        self.engine.handle_timeout(now)

    def poll_transmit(self) -> bytes | None:
        """Only the next datagram (callers that keep datagrams and events apart)."""
        return self.engine.poll_transmit()

    def poll_event(self) -> Event | None:
        """Only the next event (callers that keep datagrams and events apart)."""
        return self.engine.poll_event()

    handle_datagram = handle_input  # the older name, kept for existing callers

    # --- user operations --------------------------------------------------------------

    def start(self, now: float) -> None:
        """Client only: send the first ClientHello."""
        self.engine.start(now)

    def send_application_data(self, data: bytes) -> None:
        self.engine.send_application_data(data)

    def key_update(self, now: float, *, request_peer: bool = True) -> None:
        """DTLS 1.3 only (RFC 8446 §4.6.3); a 1.2 association cannot rekey."""
        if not isinstance(self.engine, Engine13):
            raise LocalProtocolError("KeyUpdate needs DTLS 1.3")
        self.engine.key_update(now, request_peer=request_peer)

    def close(self) -> None:
        self.engine.close()

    def export_keying_material(self, label: bytes, length: int) -> bytes:
        return self.engine.export_keying_material(label, length)


#: The one connection class (issue 27 item 6); ``DtlsConnection`` is its established name.
Connection = DtlsConnection
