"""Per-packet cost of ``RtpLeg`` (transceiver/rtp_leg.py), receive and send, for plain RTP
and two SDES-SRTP suites, against a baseline measured in the same run: the bare work any
leg must do (header read, and pylibsrtp unprotect/protect with the same keys).

    .venv/bin/python bench/rtp_leg.py [--packets 20000]

Prints µs per packet and the ratio leg / baseline; wall time on a shared box, so read the
ratio.
"""

from __future__ import annotations

import argparse
import random
import time

from appliance.proto.rtp import rtp_header, rtp_header_fields_untrusted
from appliance.proto.sdp.sdes import CryptoSuite
from appliance.transceiver.rtp_leg import RtpLeg, RtpLegConfig, SdesKeys

PEER = ("10.0.0.1", 4000)
US = ("10.0.0.2", 5000)


class _Sink:
    def handle_rtp(self, now: float, plain: bytes, ssrc: int, seq: int, ts: int,
                   marker: bool, off: int, end: int) -> None:
        pass

    def poll_timeout(self) -> float | None:
        return None

    def handle_timeout(self, now: float) -> None:
        pass


def _keys(suite: CryptoSuite | None) -> tuple[SdesKeys | None, SdesKeys | None]:
    if suite is None:
        return None, None
    rng = random.Random(1)
    a, b = rng.randbytes(suite.material_length), rng.randbytes(suite.material_length)
    return SdesKeys(suite, a, b), SdesKeys(suite, b, a)


def run(suite: CryptoSuite | None, n: int) -> tuple[float, float, float, float]:
    ka, kb = _keys(suite)
    sender = RtpLeg(RtpLegConfig(remote=US, ssrc=1, payload_type=0, srtp=ka, rtcp=False,
                                 media_timeout=None, rtcp_mux=True), 0.0)
    leg = RtpLeg(RtpLegConfig(remote=PEER, ssrc=2, payload_type=0, srtp=kb, rtcp=False,
                              media_timeout=None, rtcp_mux=True), 0.0)
    leg.media = _Sink()
    payload = bytes(160)
    wire = []
    for i in range(n):
        sender.send_rtp(0.0, i & 0xFFFF, 160 * i, False, payload)
        out = sender.poll_output()
        assert out is not None and hasattr(out, "payload")
        wire.append(out.payload)  # type: ignore[union-attr]
    # Receive through the leg.
    t0 = time.perf_counter()
    for i, w in enumerate(wire):
        leg.handle_input(i * 0.02, w, PEER)
    rx = (time.perf_counter() - t0) / n * 1e6
    assert leg.counters.rtp_in == n
    while leg.poll_output() is not None:
        pass
    # Send through the leg.
    t0 = time.perf_counter()
    for i in range(n):
        leg.send_rtp(i * 0.02, i & 0xFFFF, 160 * i, False, payload)
        leg.poll_output()
    tx = (time.perf_counter() - t0) / n * 1e6
    # Baseline: the same work without the leg.
    srtp_rx = kb.session() if kb is not None else None
    srtp_tx = kb.session() if kb is not None else None
    t0 = time.perf_counter()
    for w in wire:
        plain = srtp_rx.unprotect(w) if srtp_rx is not None else w
        rtp_header_fields_untrusted(plain)
    base_rx = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    for i in range(n):
        pkt = rtp_header(0, (i + 7) & 0xFFFF, 160 * i, 3) + payload
        if srtp_tx is not None:
            srtp_tx.protect(pkt)
    base_tx = (time.perf_counter() - t0) / n * 1e6
    return rx, base_rx, tx, base_tx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--packets", type=int, default=20000)
    n = ap.parse_args().packets
    for suite in (None, CryptoSuite.AES_CM_128_HMAC_SHA1_80, CryptoSuite.AEAD_AES_128_GCM):
        rx, brx, tx, btx = run(suite, n)
        name = suite.value if suite else "plain RTP"
        print(f"{name:24s} receive {rx:5.1f} µs (bare {brx:5.1f}, x{rx / brx:4.2f})   "
              f"send {tx:5.1f} µs (bare {btx:5.1f}, x{tx / btx:4.2f})")


if __name__ == "__main__":
    main()
