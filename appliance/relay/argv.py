"""The one builder of a relay worker's command line.

Two parents start relay workers: ``appliance up`` (:func:`appliance.supervisor.child_specs`,
as ``python -m appliance relay …``) and ``appliance relay --workers M``
(:mod:`.cli`, as ``python -m appliance.relay.cli --workers 1 --worker-index I …``). Both
build the argv here, so a flag added to the relay is passed on in one place. Only what is
given is written; anything left ``None`` falls to the worker's own defaults (flags > config
file > defaults), exactly as if the flag had not been typed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..config import format_hostport

if TYPE_CHECKING:
    from .tls import TurnTls

Address = tuple[str, int]


def relay_argv(
    command: Sequence[str],
    *,
    listen: Sequence[Address],
    secret_file: str,
    control: str | None = None,
    transceivers: Mapping[int, Address] | None = None,
    next_hops: Mapping[int, Address] | None = None,
    workers: int | None = 1,
    worker_index: int | None = None,
    cluster: int | None = None,
    internal: Address | None = None,
    flow_timeout: float | None = None,
    max_flows: int | None = None,
    new_flow_rate: float | None = None,
    redis: str | None = None,
    transceiver_pattern: str | None = None,
    transceiver_count: int | None = None,
    resolve_interval: float | None = None,
    io: str | None = None,
    coalesce_us: float | None = None,
    pin: bool = False,
    nice: int | None = None,
    log_level: str | None = None,
    log_format: str | None = None,
    tcp: Sequence[Address] = (),
    tcp_max_connections: int | None = None,
    tcp_max_per_ip: int | None = None,
    tcp_https: Address | None = None,
    tcp_proxy_from: Sequence[str] = (),
    turn: bool | None = None,
    turn_secret_file: str | None = None,
    turn_realm: str | None = None,
    media_addresses: Sequence[Address] = (),
    turn_relay_ips: Sequence[str] = (),
    turn_peers: Sequence[str] = (),
    turn_max_allocations: int | None = None,
    turn_allocations_per_ip: int | None = None,
    turn_allocations_per_user: int | None = None,
    turn_max_lifetime: int | None = None,
    turn_tls: TurnTls | None = None,
    turn_state_dir: str | None = None,
) -> list[str]:
    """``command`` (e.g. ``[python, "-m", "appliance", "relay"]``) plus the flags for the
    given settings. Floats are written with ``repr`` so they survive the round trip."""
    argv = list(command)

    def opt(flag: str, value: object) -> None:
        if value is not None:
            argv.extend((flag, repr(value) if isinstance(value, float) else str(value)))

    opt("--workers", workers)
    opt("--worker-index", worker_index)
    for addr in listen:
        argv += ["--listen", format_hostport(addr)]
    for k, addr in (transceivers or {}).items():
        argv += ["--transceiver", f"{k}={format_hostport(addr)}"]
    for k, addr in (next_hops or {}).items():
        argv += ["--next-hop", f"{k}={format_hostport(addr)}"]
    opt("--secret-file", secret_file)
    opt("--control", control)
    opt("--cluster", cluster)
    opt("--internal", None if internal is None else format_hostport(internal))
    opt("--flow-timeout", flow_timeout)
    opt("--max-flows", max_flows)
    opt("--new-flow-rate", new_flow_rate)
    opt("--redis", redis or None)
    opt("--transceiver-pattern", transceiver_pattern)
    opt("--transceivers", transceiver_count)
    opt("--resolve-interval", resolve_interval)
    opt("--io", io)
    opt("--coalesce-us", coalesce_us)
    if pin:
        argv.append("--pin")
    opt("--nice", nice)
    for addr in tcp:
        argv += ["--tcp", format_hostport(addr)]
    opt("--tcp-max-connections", tcp_max_connections)
    opt("--tcp-max-per-ip", tcp_max_per_ip)
    opt("--tcp-https", None if tcp_https is None else format_hostport(tcp_https))
    for net in tcp_proxy_from:
        argv += ["--tcp-proxy-from", net]
    if turn is False:  # explicit: a worker's default is on where it knows its media address
        argv.append("--no-turn")
    elif turn:  # TURN's secrets travel as a file name, never on the command line
        argv.append("--turn")
        opt("--turn-secret-file", turn_secret_file)
        opt("--turn-realm", turn_realm)
        for addr in media_addresses:
            argv += ["--media-address", format_hostport(addr)]
        for ip in turn_relay_ips:
            argv += ["--turn-relay-ip", ip]
        for net in turn_peers:
            argv += ["--turn-peer", net]
        opt("--turn-max-allocations", turn_max_allocations)
        opt("--turn-allocations-per-ip", turn_allocations_per_ip)
        opt("--turn-allocations-per-user", turn_allocations_per_user)
        opt("--turn-max-lifetime", turn_max_lifetime)
        if turn_tls is not None:  # file names only: the key never rides on a command line
            opt("--turn-tls-cert", turn_tls.cert)
            opt("--turn-tls-key", turn_tls.key)
            for name in turn_tls.names:
                argv += ["--turn-tls-name", name]
            for name in turn_tls.https_names:
                argv += ["--tcp-https-name", name]
    # The worker index's private directory: TURN's embedded cache and the keeper's name
    # (relay/keeper.py), so with or without TURN.
    opt("--turn-state-dir", turn_state_dir)
    opt("--log-level", log_level)
    opt("--log-format", log_format)
    return argv
