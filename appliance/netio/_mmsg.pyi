"""Batched UDP receive/send for the relay and the transceiver (appliance/netio/_mmsg.c, Linux)."""

from typing_extensions import Buffer

MAX_MSGS: int

def recv_batch(
    fd: int, buf: Buffer, slot: int, headroom: int, capacity: int, max_msgs: int, /
) -> list[tuple[int, tuple[str, int]]]:
    """One ``recvmmsg``: datagram i at ``buf[i*slot+headroom:]`` (at most ``capacity`` bytes);
    ``(real length, (host, port))`` each; empty when nothing is waiting."""

def send_batch(
    fd: int, buf: Buffer, msgs: list[tuple[bytes, int, int, tuple[str, int]]], /
) -> tuple[int, int, int]:
    """``sendmmsg`` of ``header + buf[offset:offset+length]`` to each address:
    ``(sent, bytes sent, failed)``."""

def set_gso(on: bool, /) -> bool:
    """Use UDP GSO for runs of same-size datagrams to one address (default on); returns the
    previous setting."""
