"""Phone calls with media end to end: SIP into signaling, RTP through a relay worker to a
transceiver running the echo agent (``TransceiverPhoneMedia``, transceiver/phone_session.py).

* SIPp plays a 1 kHz PCMU tone from a pcap; what reaches SIPp's media port is captured on
  ``lo`` (SIPp keeps nothing it receives) and must be the tone, from the relay's port.
* ``/hangup`` ends the media on the transceiver; the call's events reach signaling.

Every wait is on a condition (SIPp's exit, captured packets, the transceiver's tables).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import trio
from sip.support import (
    SIPP,
    TIMEOUT,
    LoopbackSniffer,
    free_media_ports,
    run_sipp,
    start_phone_stack,
    write_tone_pcap,
)

from appliance.proto.rtp import rtp_header_fields_untrusted
from appliance.transceiver import g711

pytestmark = [pytest.mark.interop,
              pytest.mark.skipif(SIPP is None, reason="sipp missing: `make sysdeps`")]


def peak_hz(payloads: list[bytes]) -> float:
    dec = g711.G711Decoder("pcmu")
    pcm = np.frombuffer(b"".join(dec.decode(p) for p in payloads), dtype="<i2").astype(float)
    spec = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    return float(np.argmax(spec) * 48000 / len(pcm))


async def eventually(pred: object, what: str) -> None:
    assert callable(pred)
    with trio.fail_after(TIMEOUT):
        while not pred():  # noqa: ASYNC110 - polling state that lives in other tasks
            await trio.sleep(0.02)


@pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root (AF_PACKET)")
async def test_sipp_pcap_tone_comes_back_from_the_echo_agent(nursery: trio.Nursery,
                                                            tmp_path: Path) -> None:
    stack = await start_phone_stack(nursery, tmp_path)
    sent = write_tone_pcap(tmp_path / "tone.pcap", seconds=3.0)
    mp = free_media_ports()
    sniff = LoopbackSniffer(mp, stack.relay_public[1])
    nursery.start_soon(sniff.run)
    with trio.fail_after(TIMEOUT):
        run = await run_sipp(nursery, stack.phone, "echo_pcap.xml", cwd=tmp_path, media_port=mp)
        code, out = await run.result()
        assert code == 0, out
        await sniff.wait_for(100)
    rtp = [rtp_header_fields_untrusted(p) + (p,) for p in sniff.payloads]
    audio = [p[off:end] for pt, _s, _t, _ssrc, _m, off, end, p in rtp if pt == 0]
    assert len({r[3] for r in rtp}) == 1  # one SSRC: ours
    assert 100 <= len(audio) <= sent + 5  # most of the 150 packets came back, none invented
    assert abs(peak_hz(audio[10:]) - 1000) < 30  # and they carry the caller's tone
    seqs = [r[1] for r in rtp]
    assert all((b - a) & 0xFFFF == 1 for a, b in zip(seqs, seqs[1:], strict=False))
    tr = stack.transceiver
    await eventually(lambda: not tr.phones, "the BYE ended the phone session")
    assert tr.counters["phones_created"] == 1 and tr.counters["phones_ended"] == 1
    ended = tr.ended_phones[-1]
    assert ended["end_reason"] == "sip-ended" and ended["phone"]["latched"] == f"127.0.0.1:{mp}"
    assert ended["phone"]["leg"]["stray"] == 0
