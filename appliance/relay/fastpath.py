"""The relay's hot path, written once: one drain for every socket, one loop for all drains.

Per-datagram event-loop round trips are what make a textbook trio relay slow (DESIGN.md
"Relay behaviour": pre-allocated buffers, drain a ready socket before yielding), so:

* :func:`make_drain` builds the one routing loop. A drain owns a slot buffer allocated once
  (datagram ``i`` of a batch at ``buf[i*slot + headroom:]``, the headroom being room for
  the PROXY header we prepend) and, per round, asks its I/O adapter for a batch
  (``recv() -> [(length, source), ...]``), routes every datagram of it by queueing
  ``(header, offset, length, destination)`` entries on outboxes, then has the adapter
  flush every outbox it filled before the next batch reuses the buffer. Up to ``BATCH``
  datagrams per call; a short batch means the socket is drained. Counters are summed in
  locals and flushed once per call; the clock is read once per call.
* The routing decisions are the core's (:mod:`.core`): a known flow's datagram from the
  flow's own hop whose first byte is in :data:`~.core.FAST_FIRST` is queued to
  ``flow.dest`` with the flow's pre-encoded header, no call; an unknown flow's datagram
  whose first byte is in ``RelayCore.no_flow_first`` is dropped ``no-flow``, no call;
  everything else goes to :meth:`RelayCore.handle_datagram`. Nothing else is decided here.
* The I/O adapters (:mod:`.io`) are only syscalls: ``python`` (``recvfrom_into`` /
  ``sendto`` per datagram) and ``mmsg`` (one ``recvmmsg`` / ``sendmmsg`` per batch, the C
  extension :mod:`appliance.netio._mmsg`). Both see the same slot layout and the same
  queues, so both paths run this same code.
* A *public* drain (one per public UDP socket) reads client datagrams; the *internal*
  drain reads PROXY v2 framed ones (DESIGN.md "Relay <-> transceiver datagram format"):
  from a configured transceiver or next hop they are return traffic ("send this payload
  from ``public`` to ``client``"), queued on the return sink the header's destination
  names (:mod:`.transport`) — or, for a flow that reached us through an upstream relay,
  re-framed back to that relay; from anyone else they are an upstream relay's client
  datagrams and are routed exactly like a public socket's, with that relay as the hop.
  Parsed headers are cached by their first 28 bytes (a flow's header never changes).
* :func:`hot_loop` serves every drain of a worker in one task: it waits for readability
  of an epoll set of its own holding all the sockets, and while traffic keeps coming it
  stays on that epoll set (a blocking poll of at most ``HOLD``) instead of going back
  through trio's scheduler per wake-up (a trio round trip costs about twice a bare epoll
  one, docs/performance.md "Relay"), yielding to trio at least every ``YIELD_EVERY``.

TURN (:mod:`.turn`): ChannelData and TURN's STUN are the core's (``SLOW_FIRST``); the core's
answer for data to our own media address is a :class:`~.core.Relayed` (forward the payload's
slice of the datagram, no copy), and return traffic of a flow whose hop is
:data:`~.core.TURN_HOP` goes to the TURN gate instead of a sink.

The ICE-TCP listener (:mod:`.tcp`) is another source for a public-style drain (its frames
are handed over in the same slot layout, ``transport=Transport.TCP``, client addresses as
:class:`~appliance.proto.proxy.StreamAddr`) and another sink (:mod:`.transport`); the
internal drain picks the sink table by the return header's transport (DGRAM or STREAM).
"""

from __future__ import annotations

import ctypes
import math
import select
import struct
import sys
import time
from collections.abc import Callable, Mapping

import trio

from ..proto.proxy import (
    DGRAM,
    FAM_TCP4,
    FAM_UDP4,
    STREAM,
    ProxyError,
    StreamAddr,
    encode_header,
    parse_transport_untrusted,
)
from .core import FAST_FIRST, TURN_HOP, Address, Counters, Flow, RelayCore, Relayed
from .filter import MAX_DATAGRAM
from .transport import Flush, Out, ReturnSink, Transport

#: Room in front of a received payload for the PROXY header we prepend (≤ 52 + 3 + 64).
HEADROOM = 256
#: Datagrams drained per wake-up and socket before yielding to trio (fairness).
BATCH = 512
#: Datagrams per receive batch of a public socket (one recvmmsg on the mmsg path).
MMSG_BATCH = 64
#: Public socket slots: MSG_TRUNC reports a longer datagram's real length, so n > MAX.
PUBLIC_SLOT = HEADROOM + MAX_DATAGRAM + 64
#: Internal socket slots hold any UDP datagram (nothing is truncated); the odd stride keeps
#: the slots' first cache lines off the same L1 sets.
INTERNAL_SLOT = 256 + 65536 + 320
INTERNAL_BATCH = MMSG_BATCH // 2  # 32 slots of 64 kB
#: Longest blocking wait on the worker's own epoll set before going back to trio's
#: ``wait_readable`` (epoll's timeout has millisecond granularity).
HOLD = 0.001
#: While traffic keeps the hot loop off trio's scheduler, it yields this often.
YIELD_EVERY = 0.002
#: Coalescing (see :func:`coalesce_wait`): a wake-up that found fewer than this many
#: datagrams, less than ``DENSE`` after the previous one, waits ``RelayConfig.coalesce``.
COALESCE_BELOW = 4
DENSE = 200e-6
#: Internal socket: parsed PROXY headers are cached by their first 28 bytes (the fixed
#: 16-byte part and the IPv4 address block); the cache is cleared when it reaches this size.
PARSED_MAX = 65_536
_PARSED_KEY = struct.Struct("28s")

Receive = Callable[[], list[tuple[int, Address]]]
Drain = Callable[[float], bool]


class Outbox:
    """Datagrams queued for one socket during a round (the internal socket's)."""

    __slots__ = ("flush", "pending")

    def __init__(self, flush: Flush) -> None:
        self.pending: list[Out] = []
        self.flush = flush


def coalesce_wait(coalesce: float, got: int, since_last_wake: float) -> float:
    """How long the hot loop waits before its next poll, so that the next wake-up finds a
    batch instead of one datagram.

    Measured (docs/performance.md, "Relay", coalescing): at 50 000 datagrams/s each way
    most wake-ups carried 1-2 datagrams, each paying a poll, a ``recvmmsg`` and a
    ``sendmmsg`` of its own; waiting 20 µs after such a sparse wake-up gathers ~5 per
    wake-up and cuts the relay's CPU from ~83 % to ~69 % of a core, adding ≤ 20 µs (plus
    the wake-up) to the datagrams that arrive meanwhile. Only under dense traffic (the
    previous wake-up less than ``DENSE`` ago): at low rates nothing would arrive in the
    window, so nothing is waited.
    """
    if coalesce > 0 and got < COALESCE_BELOW and since_last_wake < DENSE:
        return coalesce
    return 0.0


def fine_timer_slack() -> None:
    """Linux rounds a thread's timed sleeps up by its timer slack (50 µs by default), which
    would turn a 20 µs coalescing wait into 70 µs: ask for 1 µs (``PR_SET_TIMERSLACK``)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, ns
    except (OSError, AttributeError):  # pragma: no cover - not glibc/musl Linux
        pass


def make_drain(
    core: RelayCore,
    *,
    recv: Receive,
    buf: bytearray,
    slot: int,
    count: int,
    internal: Outbox,
    public: Address | None = None,
    reply: ReturnSink | None = None,
    sinks: Mapping[Address, ReturnSink] | None = None,
    returners: set[Address] | None = None,
    tlv: bytes = b"",
    transport: Transport = Transport.UDP,
    stream_sinks: Mapping[Address, ReturnSink] | None = None,
    local: Callable[[float, memoryview, Address], object] | None = None,
) -> Drain:
    """The drain of one socket: ``drain(now)`` handles up to ``BATCH`` datagrams and says
    whether the socket may hold more.

    A public socket's drain gets ``public`` (its address) and ``reply`` (its own sink: the
    core's STUN answers go out of it). The internal socket's drain gets ``sinks`` (every
    return sink by public address), ``returners`` (the sources whose datagrams are return
    traffic; mutated in place by the resolver) and ``tlv`` (the relay-id TLV of framed
    replies); its datagrams are PROXY v2 framed. ``stream_sinks`` are the ICE-TCP
    listeners' sinks by public address (return datagrams with a STREAM header go there);
    ``transport`` is how a public drain's clients reach us (TCP for the listener's).
    ``local`` gets the internal socket's PROXY v2 LOCAL datagrams from return sources
    (flow vouching, :mod:`.reseed`).
    """
    framed = public is None
    public_addr: Address = public if public is not None else ("", 0)  # framed: per datagram
    c: Counters = core.counters
    drop = c.drop
    flows = core.flows
    get = flows.get
    lru = flows.move_to_end
    slow = core.handle_datagram
    note_answer = core.note_answer
    fast_first = FAST_FIRST
    no_flow_first = core.no_flow_first
    MAX = MAX_DATAGRAM
    H = HEADROOM
    SLOT = slot
    NB = count
    rounds = max(1, BATCH // NB)
    mv = memoryview(buf)
    forward = internal.pending.append
    outboxes: list[tuple[Flush, list[Out]]] = [(internal.flush, internal.pending)]
    answer: Callable[[Out], None] | None = None
    if reply is not None:
        answer = reply.pending.append
        outboxes.append((reply.flush, reply.pending))
    sink_get = {a: s.pending.append for a, s in (sinks or {}).items()}.get
    stream_get = {a: s.pending.append for a, s in (stream_sinks or {}).items()}.get
    outboxes += [(s.flush, s.pending) for s in (sinks or {}).values()]
    outboxes += [(s.flush, s.pending) for s in (stream_sinks or {}).values()]
    tcp = Transport.TCP
    # TURN (relay/turn.py): return traffic of flows whose client is a relayed address goes
    # back through the gate, which wraps it for the TURN client.
    turn_hop = TURN_HOP
    turn_back = core.turn.back if core.turn is not None else None
    flushes = tuple(outboxes)
    returning = returners if returners is not None else set()
    parse = parse_transport_untrusted
    parsed: dict[bytes, tuple[Address, Address, int, bool]] = {}
    parsed_get = parsed.get
    key_of = _PARSED_KEY.unpack_from
    nothing = b""

    def drain(now: float) -> bool:
        pin = bin_ = pout = bout = no_flow = oversize = failed = 0
        readable = True
        pub = public_addr
        hop: Address | None = None
        tp = transport
        stream = False
        for _ in range(rounds):
            msgs = recv()
            pin += len(msgs)
            p = H - SLOT
            for n, src in msgs:
                p += SLOT  # where this datagram starts in buf
                bin_ += n
                if framed:
                    # PROXY v2 first. A flow's header is the same every time: its first
                    # 28 bytes (signature .. IPv4 addresses, length field included)
                    # determine the parse, so a cache hit skips parse_untrusted (~1 µs).
                    key = key_of(buf, p)[0]
                    hit = parsed_get(key)
                    if hit is not None:
                        client, pub, off, stream = hit
                        if off > n:  # shorter than its header says
                            drop("proxy-malformed")
                            continue
                    else:
                        try:
                            client, pub, off, kind = parse(mv[p : p + n])
                        except ProxyError:
                            if local is not None and buf[p + 12] == 0x20 and src in returning:
                                local(now, mv[p : p + n], src)  # a vouch (reseed.py)
                            else:
                                drop("proxy-malformed")
                            continue
                        # An ICE-TCP flow's client is keyed apart from a UDP one's.
                        stream = kind == STREAM
                        if stream:
                            client = StreamAddr(client)
                        if buf[p + 13] in (FAM_UDP4, FAM_TCP4):  # IPv6 does not fit the key
                            if len(parsed) >= PARSED_MAX:
                                parsed.clear()
                            parsed[key] = (client, pub, off, stream)
                    q = p + off  # where the client's datagram starts in buf
                    size = n - off
                    if src in returning:
                        # Return traffic: "send this payload from `pub` to `client`".
                        flow = get(client)
                        if flow is not None:
                            if not flow.answered:
                                note_answer(flow, mv[q : q + size])  # issue 9: stun-budget
                            if flow.upstream is not None:
                                if flow.upstream is turn_hop:
                                    if turn_back is not None:
                                        turn_back(now, flow, mv, q, size)
                                    continue
                                # The flow came through an upstream relay: back along the hop.
                                forward((flow.header, q, size, flow.upstream))
                                continue
                        back = stream_get(pub) if stream else sink_get(pub)
                        if back is None:
                            drop("return-unknown-public")
                            continue
                        back((nothing, q, size, client))
                        continue
                    hop = src  # an upstream relay's client datagram: route it like ours
                    tp = tcp if stream else transport
                else:
                    if n > MAX:  # where the kernel filter is missing
                        oversize += 1
                        continue
                    client, q, size = src, p, n
                # -- the routing decision (core.py's tables, then the core itself) --------
                flow = get(client)
                if size:
                    first = buf[q]
                    if flow is None:
                        if no_flow_first[first]:
                            no_flow += 1  # junk from an unknown flow: no call into the core
                            continue
                    elif fast_first[first] and flow.upstream == hop:
                        forward((flow.header, q, size, flow.dest))
                        flow.last_seen = now
                        lru(client)
                        continue
                res = slow(now, client, mv[q : q + size], pub, hop, tp)
                if res is None:
                    continue
                if isinstance(res, Flow):
                    forward((res.header, q, size, res.dest))
                elif isinstance(res, Relayed):  # TURN data to our own media address
                    rf = res.flow
                    forward((rf.header, q + res.offset, res.length, rf.dest))
                elif answer is not None:
                    answer((res, 0, 0, client))
                else:  # a reflexive answer to an upstream relay's client goes back framed
                    h = encode_header(client, pub, tlv, STREAM if stream else DGRAM)
                    forward((h + res, 0, 0, src))
            for flush, queue in flushes:
                if queue:
                    sent, nbytes, bad = flush(buf, queue)
                    queue.clear()
                    pout += sent
                    bout += nbytes
                    failed += bad
            if len(msgs) < NB:
                readable = False
                break
        c.packets_in += pin
        c.bytes_in += bin_
        c.packets_out += pout
        c.bytes_out += bout
        if no_flow:
            drop("no-flow", no_flow)
        if oversize:
            drop("oversize", oversize)
        if failed:
            drop("send-failed", failed)
        return readable

    return drain


async def hot_loop(
    drains: Mapping[int, Drain],
    counters: Counters,
    *,
    wake: Callable[[], None],
    coalesce: float = 0.0,
    clock: Callable[[], float] = trio.current_time,
) -> None:
    """Every drain of a worker (keyed by socket fd), in one task (module docstring).

    ``wake`` runs whenever the loop is about to let other tasks run (it yields to trio, or
    goes back to ``wait_readable``): the Redis and resolver tasks are woken there.
    """
    sleep = time.sleep
    if coalesce:
        fine_timer_slack()
    c = counters
    ep = select.epoll()
    try:
        for fd in drains:
            ep.register(fd, select.EPOLLIN)
        poll = ep.poll
        while True:
            await trio.lowlevel.wait_readable(ep)
            now = clock()
            yield_at = now + YIELD_EVERY
            timeout = 0.0
            last_wake = -math.inf
            while True:
                events = poll(timeout)
                if not events:
                    wake()
                    break  # HOLD without traffic: back to trio
                c.wakeups += 1
                now = clock()
                before = c.packets_in
                more = False
                for fd, _ in events:
                    if drains[fd](now):
                        more = True
                if now >= yield_at:
                    # Only here (and before going back to wait_readable) can the Redis
                    # and resolver tasks run, so this is where they are woken.
                    wake()
                    await trio.lowlevel.checkpoint()
                    yield_at = clock() + YIELD_EVERY
                if more:
                    timeout = 0.0
                else:
                    timeout = HOLD
                    wait = coalesce_wait(coalesce, c.packets_in - before, now - last_wake)
                    if wait:
                        c.coalesced += 1
                        sleep(wait)  # blocking on purpose: see coalesce_wait
                last_wake = now
    finally:
        ep.close()

