"""Geo-steered ingress: which relay address(es) an answer advertises, from the request.

The "global relay" pattern (issue 10): a client should send its media to the relay ingress
nearest to it; the server ufrag's cluster field then carries the media on to the region whose
transceiver owns the session. Signaling only has to pick *which ingress addresses* go into
the answer's candidates, and it picks them from the request's context, configured not coded:

* ``--region-header X-Region``: a CDN or load balancer in front of signaling sets this header
  (GeoIP, PoP name, ...). A value naming a configured region picks that region. When
  ``--trusted-proxy`` is configured the header is honoured only from those proxies (a client
  talking to signaling directly cannot choose); otherwise the operator vouches that nothing
  reaches signaling without passing the header-setting proxy.
* ``--ingress-prefix CIDR=REGION``: the client's address, longest prefix first. The client
  address is the HTTP peer, or — only when the peer is a ``--trusted-proxy`` — the right-most
  ``X-Forwarded-For`` entry that is not itself a trusted proxy.
* otherwise the default: ``--public-address`` (with ``--udp-port``).

``--ingress REGION=HOST:PORT[,HOST:PORT]`` names each region's addresses; HOST is a literal
IPv4/IPv6 address (it goes into an ICE candidate line as is), IPv6 in brackets.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import parse_hostport

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Candidate = tuple[str, int]

_REGION_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
MAX_XFF_ENTRIES = 32  # an absurd X-Forwarded-For is read no further than this from the right


@dataclass(frozen=True)
class IngressChoice:
    """What :meth:`IngressMap.pick` decided (the region is None for the default)."""

    candidates: list[Candidate]
    region: str | None
    reason: str  # "header", "prefix" or "default"
    client: str | None  # the client address the decision used, if any


@dataclass
class IngressMap:
    regions: dict[str, list[Candidate]] = field(default_factory=dict)
    prefixes: list[tuple[IPNetwork, str]] = field(default_factory=list)  # longest first
    region_header: str | None = None
    trusted_proxies: list[IPNetwork] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.prefixes.sort(key=lambda p: p[0].prefixlen, reverse=True)
        for net, region in self.prefixes:
            if region not in self.regions:
                raise ValueError(f"ingress prefix {net}={region}: no --ingress for region {region!r}")

    @property
    def enabled(self) -> bool:
        return bool(self.regions)

    def trusted(self, ip: IPAddress | None) -> bool:
        return ip is not None and any(ip in net for net in self.trusted_proxies)

    def client_address(self, peer: str | None, forwarded_for: Sequence[str]) -> IPAddress | None:
        """The client's address: the peer's, or (peer a trusted proxy) the right-most
        X-Forwarded-For hop that is not a trusted proxy."""
        ip = _ip(peer)
        if ip is None or not self.trusted(ip):
            return ip
        hops = [h.strip() for value in forwarded_for for h in value.split(",")]
        for hop in reversed(hops[-MAX_XFF_ENTRIES:]):
            hop_ip = _ip(hop)
            if hop_ip is None:
                break  # garbage: trust nothing further left
            ip = hop_ip
            if not self.trusted(hop_ip):
                break
        return ip

    def pick(
        self,
        default: list[Candidate],
        *,
        peer: str | None = None,
        forwarded_for: Sequence[str] = (),
        region: str | None = None,
    ) -> IngressChoice:
        if not self.enabled:
            return IngressChoice(default, None, "default", None)
        peer_ip = _ip(peer)
        client = self.client_address(peer, forwarded_for)
        shown = None if client is None else str(client)
        if self.region_header and region is not None:
            name = region.strip()
            header_ok = not self.trusted_proxies or self.trusted(peer_ip)
            if header_ok and name in self.regions:
                return IngressChoice(list(self.regions[name]), name, "header", shown)
        if client is not None:
            if isinstance(client, ipaddress.IPv6Address) and client.ipv4_mapped is not None:
                client = client.ipv4_mapped
            for net, name in self.prefixes:
                if client.version == net.version and client in net:
                    return IngressChoice(list(self.regions[name]), name, "prefix", shown)
        return IngressChoice(default, None, "default", shown)


def _ip(text: str | None) -> IPAddress | None:
    if not text:
        return None
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[v6]:port" as some proxies write it
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # "v4:port"
        text = text.partition(":")[0]
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None


def _entries(value: Any, what: str) -> list[tuple[str, Any]]:
    """Flags (``["K=V", ...]``) or a TOML table (``{K = V}``) -> [(K, V), ...]."""
    if value is None:
        return []
    if isinstance(value, Mapping):
        return [(str(k), v) for k, v in value.items()]
    if isinstance(value, str):
        value = [value]
    out: list[tuple[str, Any]] = []
    for item in value:
        key, sep, rest = str(item).partition("=")
        if not sep or not key.strip() or not rest.strip():
            raise ValueError(f"{what} {item!r}: expected KEY=VALUE")
        out.append((key.strip(), rest.strip()))
    return out


def parse_candidate(text: str, default_port: int) -> Candidate:
    """``"198.51.100.1:3478"``, ``"[2001:db8::1]:3478"`` or a bare address (the default
    port) -> (ip, port); the address must be a literal, advertisable IP."""
    text = text.strip()
    try:
        bare = ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        bare = None
    if bare is not None:
        host, port = str(bare), default_port
    else:
        host, port = parse_hostport(text, default_host="")
        if not host:
            raise ValueError(f"ingress address {text!r}: the host is missing")
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        raise ValueError(f"ingress address {text!r}: the host must be an IP address, "
                         "not a name (it goes into the ICE candidate as is)") from None
    if ip.is_unspecified or ip.is_multicast:
        raise ValueError(f"ingress address {text!r} cannot be advertised")
    if not 1 <= port <= 65535:
        raise ValueError(f"ingress address {text!r}: port must be 1..65535")
    return str(ip), port


def _region(name: str, what: str) -> str:
    if not name or len(name) > 64 or not set(name) <= _REGION_CHARS:
        raise ValueError(f"{what}: region {name!r} must be 1..64 of [A-Za-z0-9._-]")
    return name


def _addresses(value: Any) -> Iterable[str]:
    items = [value] if isinstance(value, str) else list(value)
    for item in items:
        for part in str(item).split(","):
            if part.strip():
                yield part


def parse_ingress_map(
    *,
    ingress: Any = None,
    prefixes: Any = None,
    region_header: str | None = None,
    trusted_proxies: Any = None,
    default_port: int = 3478,
) -> IngressMap:
    """Build the map from flags or TOML values; raises ValueError with a clear message."""
    regions: dict[str, list[Candidate]] = {}
    for name, value in _entries(ingress, "--ingress"):
        _region(name, "--ingress")
        cands = regions.setdefault(name, [])
        for addr in _addresses(value):
            cand = parse_candidate(addr, default_port)
            if cand not in cands:
                cands.append(cand)
        if not cands:
            raise ValueError(f"--ingress {name}: no address")
    nets: list[tuple[IPNetwork, str]] = []
    for cidr, name in _entries(prefixes, "--ingress-prefix"):
        try:
            net = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ValueError(f"--ingress-prefix {cidr!r}: not a CIDR prefix") from None
        nets.append((net, _region(str(name), "--ingress-prefix")))
    proxies: list[IPNetwork] = []
    items = [trusted_proxies] if isinstance(trusted_proxies, str) else (trusted_proxies or [])
    for item in items:
        for part in str(item).split(","):
            if not part.strip():
                continue
            try:
                proxies.append(ipaddress.ip_network(part.strip(), strict=False))
            except ValueError:
                raise ValueError(f"--trusted-proxy {part!r}: not an address or CIDR") from None
    header = (region_header or "").strip() or None
    if header is not None and not all(c.isalnum() or c in "-_" for c in header):
        raise ValueError(f"--region-header {header!r}: not an HTTP header name")
    if (nets or header) and not regions:
        raise ValueError("--ingress-prefix/--region-header need at least one --ingress REGION=...")
    return IngressMap(regions=regions, prefixes=nets, region_header=header,
                      trusted_proxies=proxies)
