"""The seam between the relay's routing and the client-side transports (no I/O here).

The routing decision (:mod:`.core`, applied per batch by :mod:`.fastpath`) does not care how a
client datagram arrived: a UDP datagram on a public socket today, an RFC 4571 frame of an
ICE-TCP connection (RFC 6544) tomorrow. What it needs from a transport is three things:

* a :class:`Transport` tag, which the flow keeps (:attr:`Flow.transport <.core.Flow>`) and
  which picks the PROXY v2 transport nibble of the internal-leg header: DGRAM (``\\x12`` /
  ``\\x22``) for UDP, STREAM (``\\x11`` / ``\\x21``) for TCP (DESIGN.md "Relay <->
  transceiver datagram format"; HAProxy PROXY protocol spec §2.2, the family byte is
  ``address family << 4 | transport``);
* the client's datagrams, fed to the same drain as the public UDP sockets' (a listener is a
  *source*: it hands the fast path ``(length, client)`` entries over a slot buffer);
* a :class:`ReturnSink`: where the return traffic of its flows goes. The internal drain
  queues ``(header, offset, length, client)`` entries on the sink named by the return
  datagram's PROXY header (its transport and destination = the public address the client
  talks to), and the I/O adapter flushes the queue once per round. For UDP the sink is the
  public socket (one ``sendmmsg``, or one ``sendto`` per entry); a TCP sink finds the
  client's connection and writes each payload with its 2-byte RFC 4571 length prefix.

::

    client --UDP--> public socket --+                     +--> internal socket --> transceiver
    client --TCP--> TcpListener -----+-> fastpath (core) -+
    client <-UDP--- UdpSink  <------+                     +<-- internal socket <-- transceiver
    client <-TCP--- TcpSink  <-------+

ICE-TCP (:mod:`.tcp`) is exactly that: a listener that accepts connections and strips
RFC 4571 framing into a slot buffer, a sink that frames back, registered under
``(Transport.TCP, public address)`` (``RelayCore.sinks``) — no change to the routing. The
internal leg itself stays UDP (one internal datagram per frame); its PROXY header says STREAM
(:func:`encode_flow_header`), and the internal drain reads the transport back with
``appliance.proto.proxy.parse_transport_untrusted`` to pick the sink table. A TCP flow's
client address is a :class:`~appliance.proto.proxy.StreamAddr`, so a UDP and a TCP flow
from the same ``ip:port`` are two flows.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol

from ..proto.proxy import encode_header

Address = tuple[str, int]

#: One queued datagram: ``header + buf[offset:offset+length]`` to ``dest``. ``header`` may be
#: empty (return traffic goes out bare) and ``length`` 0 (a reply built by the core: the
#: header *is* the datagram).
Out = tuple[bytes, int, int, Address]

#: ``flush(buf, pending) -> (sent, bytes sent, failed)``: send every entry (never raises for
#: a per-datagram error; failures are counted). Written by the I/O adapters (:mod:`.io`).
Flush = Callable[[bytearray, list[Out]], tuple[int, int, int]]


class Transport(enum.Enum):
    """How a flow's client reaches the relay; the value is the PROXY v2 transport nibble."""

    UDP = 0x2  # DGRAM
    TCP = 0x1  # STREAM (ICE-TCP, RFC 6544; relay/tcp.py)


class ReturnSink(Protocol):
    """Where return traffic to the clients of one (transport, public address) goes.

    ``pending`` is filled by the internal drain (``(b"", offset, length, client)``) and by
    the public drain (the core's STUN answers); :meth:`flush` sends it and is called once per
    round by the drain that filled it, with that drain's buffer, before the buffer is reused.
    """

    transport: Transport
    public: Address
    pending: list[Out]

    def flush(self, buf: bytearray, pending: list[Out]) -> tuple[int, int, int]: ...


class UdpSink:
    """A public UDP socket as a return sink (the adapter's ``flush`` on its fd)."""

    __slots__ = ("flush", "pending", "public")

    transport = Transport.UDP

    def __init__(self, public: Address, flush: Flush) -> None:
        self.public = public
        self.pending: list[Out] = []
        self.flush = flush


def encode_flow_header(
    transport: Transport, client: Address, public: Address, tlvs: bytes = b""
) -> bytes:
    """The PROXY v2 header a flow's datagrams carry on the internal leg (source = client,
    destination = public; DESIGN.md), with the transport nibble of ``transport``."""
    return encode_header(client, public, tlvs, transport.value)
