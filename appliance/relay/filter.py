"""The public sockets' kernel filter: junk is dropped before it takes room in the buffer.

On Linux each public socket gets a classic BPF program (``SO_ATTACH_FILTER``, no privilege
needed) that drops, in the kernel, payloads larger than ``MAX_DATAGRAM`` and payloads whose
first byte RFC 7983 §7 gives to nothing we relay — not STUN [0..3], DTLS [20..63] or
RTP/RTCP [128..191], and, with TURN on (relay/turn.py), TURN ChannelData [64..127]; those
never reach a transceiver anyway (issue 9, floods). The hot loop
still checks the size (``oversize``) where the filter is missing (another OS, a seccomp
profile that refuses it).
"""

from __future__ import annotations

import ctypes
import socket
import struct
import sys

#: Largest client payload relayed. WebRTC stacks keep datagrams under the path MTU
#: (libwebrtc: ~1200 bytes of RTP, DTLS records fragmented to the MTU); this leaves room
#: for jumbo-ish paths while a 65 kB datagram never occupies the socket buffer.
MAX_DATAGRAM = 2048

_SO_ATTACH_FILTER = 26  # Linux, <asm-generic/socket.h>; absent from Python's socket module


def public_filter_program(max_payload: int, *, turn: bool = False) -> bytes:
    """Classic BPF for a UDP socket (the UDP header is at offset 0, the payload at 8):
    accept an empty payload (the loop counts it) and payloads of at most ``max_payload``
    bytes whose first byte is STUN [0..3], DTLS [20..63] or RTP/RTCP [128..191] — and, with
    ``turn``, TURN ChannelData [64..127] (channels 0x4000-0x7FFF, proto/turn/channel.py)."""
    ld_len, ldb_abs, ret_k = 0x80, 0x30, 0x06
    jgt_k, jge_k = 0x25, 0x35
    accept, drop = 0xFFFFFFFF, 0
    # (code, jump-if-true, jump-if-false, k) with the jumps as labels, resolved below.
    body: list[tuple[int, str | int, str | int, int]] = [
        (ld_len, 0, 0, 0),
        (jgt_k, "drop", 0, max_payload + 8),  # too long
        (jgt_k, 0, "accept", 8),  # empty payload
        (ldb_abs, 0, 0, 8),  # first payload byte
        (jge_k, "drop", 0, 192),  # 192..255
        (jge_k, "accept", 0, 128),  # RTP/RTCP
    ]
    if turn:
        body += [(jge_k, "accept", 0, 64)]  # 64..127: TURN ChannelData
    else:
        body += [(jge_k, "drop", 0, 64)]  # 64..127 (TURN channel, QUIC, unassigned)
    body += [
        (jge_k, "accept", 0, 20),  # DTLS
        (jge_k, "drop", 0, 4),  # 4..19 (ZRTP, unassigned); else STUN
    ]
    labels = {"accept": len(body), "drop": len(body) + 1}
    prog = []
    for i, (code, jt, jf, k) in enumerate(body):
        # Jumps count instructions after the next one.
        jt_n = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf_n = labels[jf] - i - 1 if isinstance(jf, str) else jf
        prog.append((code, jt_n, jf_n, k))
    prog += [(ret_k, 0, 0, accept), (ret_k, 0, 0, drop)]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


def attach_public_filter(sock: socket.socket, max_payload: int = MAX_DATAGRAM, *,
                         turn: bool = False) -> bool:
    """Attach the public-socket filter (Linux only); False if the kernel refused it."""
    if not sys.platform.startswith("linux"):
        return False  # pragma: no cover
    code = public_filter_program(max_payload, turn=turn)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HL", len(code) // 8, ctypes.addressof(buf))  # struct sock_fprog
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
    except OSError:  # pragma: no cover - e.g. a seccomp profile; the loop still drops
        return False
    return True
