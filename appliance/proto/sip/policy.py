"""The transport policy of the SIP endpoint: who may talk to it at all (issue 28 item 6).

The first layer a datagram or stream message meets (docs/sip.md): the allow hook judges the
source address before anything is parsed — ALLOW (a trunk's network), REFUSE (a minimal
403, never larger than the request) or DROP (silence: SIP scanners get nothing back).
``--sip-allow CIDR`` builds one with :func:`cidr_policy`; without it, loopback only.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Callable, Iterable


class Decision(enum.Enum):
    """What the allow hook says about a source address (issue 28 item 6)."""

    ALLOW = "allow"  # a trunk's network: served, and counted as verified for UDP sizes
    REFUSE = "refuse"  # answered 403 (minimal, never larger than the request)
    DROP = "drop"  # silence: SIP scanners get nothing back


def loopback_only(ip: str) -> Decision:
    return Decision.ALLOW if ip.startswith("127.") or ip == "::1" else Decision.REFUSE


def cidr_policy(cidrs: Iterable[str], *, drop: bool = False,
                loopback: bool = True) -> Callable[[str], Decision]:
    """The allow hook for ``--sip-allow CIDR`` (repeatable): sources inside any network are
    served; the rest get 403, or silence with ``drop`` (issue 28 item 6). Loopback is
    allowed unless ``loopback=False``, as for the HTTP API. IPv4-mapped IPv6 sources are
    judged as IPv4."""
    nets = [ipaddress.ip_network(c, strict=False) for c in cidrs]
    if loopback:
        nets += [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]
    otherwise = Decision.DROP if drop else Decision.REFUSE

    def allow(ip: str) -> Decision:
        try:
            addr = ipaddress.ip_address(ip.split("%", 1)[0])
        except ValueError:
            return otherwise
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        return Decision.ALLOW if any(addr in n for n in nets) else otherwise

    return allow
