"""What ``--sip`` / ``--sip-tls`` / ``--sip-allow`` / ``--sip-agent`` say, as one value.

Kept apart from the shell (sip_server.py) so :class:`~.state.SignalingConfig` can hold it
without importing sockets, and apart from options.py so it holds no argparse. The allow hook
the SIP core asks for every datagram (:class:`~appliance.proto.sip.Decision`) is built here
from the CIDR list: ``--sip-allow`` replaces the default (loopback only); a refused source
gets a minimal 403, or nothing with ``--sip-drop-refused`` (scanners hit every public 5060).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..proto.sip import Decision
from .sip_trunks import Trunk

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
LOOPBACK: tuple[str, ...] = ("127.0.0.0/8", "::1/128")


def parse_networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    out: list[Network] = []
    for text in cidrs:
        try:
            out.append(ipaddress.ip_network(str(text).strip(), strict=False))
        except ValueError:
            raise ValueError(f"--sip-allow {text!r} is not an IP network (CIDR)") from None
    return tuple(out)


@dataclass
class SipSettings:
    """The SIP listeners and call control of the signaling process (docs/sip.md)."""

    udp_tcp: tuple[str, int]  # --sip: UDP and TCP on the same port (0: any free port)
    tls: tuple[str, int] | None = None  # --sip-tls
    tls_cert: str | None = None
    tls_key: str | None = None
    allow: tuple[Network, ...] = field(default_factory=lambda: parse_networks(LOOPBACK))
    drop_refused: bool = False
    #: the host in our Via/Contact (and the o=/c= of nothing: media uses the public address)
    sip_host: str | None = None
    #: with no --webhook-url: answer every trunk call at once with this agent (dev box)
    agent: str | None = None
    #: an incoming call not accepted or rejected in this long gets 480 (issue 28: bounded)
    answer_timeout: float = 30.0
    max_connections: int = 256  # TCP + TLS connections at once; beyond, new ones are closed
    idle_timeout: float = 600.0  # a TCP/TLS connection silent this long is closed
    #: new SIP transactions per second per source IP (burst: twice that)
    rate: float = 20.0
    #: concurrent incoming INVITEs not yet answered; beyond, 503 + Retry-After
    max_invites: int = 64
    #: --sip-trunks FILE: the trunks outbound calls go through (sip_trunks.py), by name
    trunks: dict[str, Trunk] = field(default_factory=dict)
    #: where serve_sip bound ((udp+tcp), tls), port 0 resolved; set once it serves
    bound: tuple[tuple[str, int], tuple[str, int] | None] | None = None

    def allow_hook(self) -> Callable[[str], Decision]:
        nets = self.allow
        refused = Decision.DROP if self.drop_refused else Decision.REFUSE

        def decide(ip: str) -> Decision:
            try:
                addr = ipaddress.ip_address(ip.split("%", 1)[0])
            except ValueError:
                return refused
            if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
                addr = addr.ipv4_mapped
            return Decision.ALLOW if any(addr in n for n in nets) else refused

        return decide
