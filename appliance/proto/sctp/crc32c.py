"""CRC32c (Castagnoli), the SCTP checksum: RFC 9260 §6.8 and Appendix A.

A table-driven implementation in pure Python (reflected polynomial 0x82F63B78) that works
on 4 bytes per step ("slicing-by-4": four 256-entry tables), which measures ~2x faster
than the byte loop in CPython. If the optional C extension ``google_crc32c`` is importable
(aiortc depends on it, so test environments have it) it is used instead: it is ~100x
faster on a full 1200-byte packet. Both give identical results (tests check).
"""

from __future__ import annotations

from collections.abc import Callable

_POLY = 0x82F63B78


def _make_tables() -> tuple[list[int], list[int], list[int], list[int]]:
    t0 = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        t0.append(c)
    t1 = [(t0[c & 0xFF] ^ (c >> 8)) for c in t0]
    t2 = [(t0[c & 0xFF] ^ (c >> 8)) for c in t1]
    t3 = [(t0[c & 0xFF] ^ (c >> 8)) for c in t2]
    return t0, t1, t2, t3


_T0, _T1, _T2, _T3 = _make_tables()


def crc32c_python(data: bytes | bytearray | memoryview) -> int:
    """RFC 9260 Appendix A CRC32c of ``data``, four bytes per loop iteration."""
    t0, t1, t2, t3 = _T0, _T1, _T2, _T3
    crc = 0xFFFFFFFF
    mv = memoryview(data).cast("B")
    n = len(mv)
    head = n - (n % 4)
    if head:
        words = mv[:head].cast("I") if _LITTLE else None
        if words is not None:
            for w in words:
                crc ^= w
                crc = t3[crc & 0xFF] ^ t2[(crc >> 8) & 0xFF] ^ t1[(crc >> 16) & 0xFF] ^ t0[crc >> 24]
        else:  # pragma: no cover - big-endian hosts
            for i in range(0, head, 4):
                crc ^= int.from_bytes(mv[i : i + 4], "little")
                crc = t3[crc & 0xFF] ^ t2[(crc >> 8) & 0xFF] ^ t1[(crc >> 16) & 0xFF] ^ t0[crc >> 24]
    for b in mv[head:]:
        crc = t0[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _little() -> bool:
    import sys

    return sys.byteorder == "little" and memoryview(b"\0\0\0\0").cast("I").itemsize == 4


_LITTLE = _little()


def _accelerated() -> Callable[[bytes], int] | None:
    try:
        from google_crc32c import value  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    fn: Callable[[bytes], int] = value
    return fn


_FAST = _accelerated()
#: True when the C extension is in use (reported by the benchmark).
ACCELERATED = _FAST is not None


def crc32c(data: bytes) -> int:
    """CRC32c of ``data`` with the fastest implementation available."""
    if _FAST is not None:
        return _FAST(data)
    return crc32c_python(data)
