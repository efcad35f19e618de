"""Phone calls with media end to end: SIP into signaling, RTP through a relay worker to a
transceiver running the echo agent (``TransceiverPhoneMedia``, transceiver/phone_session.py).

* SIPp plays a 1 kHz PCMU tone from a pcap; what reaches SIPp's media port is captured on
  ``lo`` (SIPp keeps nothing it receives) and must be the tone, from the relay's port.
* baresip (a real softphone, headless: ``aufile`` microphone, ``sndfile`` recording) calls
  in over UDP, TCP and TLS (the generated ``--sip-tls`` certificate) and with SDES-SRTP
  (``mediaenc=srtp-mand``), plays a 700 Hz tone and must hear it back (FFT of what it
  recorded); the digits it presses (RFC 4733) must reach signaling through the
  transceiver's ``events``; ``/hangup`` (the SDK) must end the media.

Every wait is on a condition (SIPp's exit, captured packets, the transceiver's tables).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from sip.support import (
    BARESIP,
    SIPP,
    TIMEOUT,
    Baresip,
    LoopbackSniffer,
    NatNet,
    free_media_ports,
    run_sipp,
    start_phone_stack,
    write_tone_pcap,
    write_tone_wav,
)

from appliance.audio import g711
from appliance.proto.rtp import rtp_header_fields_untrusted

pytestmark = [pytest.mark.interop]


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


@pytest.mark.skipif(SIPP is None, reason="sipp missing: `make sysdeps`")
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
    # in order and never repeated (a gap may be the capture's own loss on a loaded box)
    assert all(0 < (b - a) & 0xFFFF < 1000 for a, b in zip(seqs, seqs[1:], strict=False))
    tr = stack.transceiver
    await eventually(lambda: not tr.calls, "the BYE ended the phone session")
    assert tr.counters["phones_created"] == 1 and tr.counters["phones_ended"] == 1
    ended = tr.ended_phones[-1]
    assert ended["end_reason"] == "sip-ended" and ended["phone"]["latched"] == f"127.0.0.1:{mp}"
    assert ended["phone"]["leg"]["stray"] == 0


def tls_settings(tmp_path: Path) -> dict[str, object]:
    """``--sip-tls`` with the self-signed certificate the appliance generates."""
    import argparse

    from appliance.signaling.options import add_sip_arguments, sip_settings

    parser = argparse.ArgumentParser()
    add_sip_arguments(parser)
    for flag in ("--state-dir", "--tls-cert", "--tls-key"):
        parser.add_argument(flag)
    args = parser.parse_args(["--sip", "127.0.0.1:0", "--sip-tls", "127.0.0.1:0",
                              "--state-dir", str(tmp_path)])
    made = sip_settings(args, ["127.0.0.1"])
    assert made is not None and made.tls_cert is not None
    return {"tls": made.tls, "tls_cert": made.tls_cert, "tls_key": made.tls_key}


def wav_peak(path: Path) -> tuple[float, float, float]:
    """(peak frequency, RMS, seconds) of a mono PCM16 WAV."""
    import wave

    with wave.open(str(path)) as w:
        rate, x = w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    x = x.astype(float)[rate // 2:]  # past the call's first half second
    if len(x) < rate:
        return 0.0, 0.0, len(x) / rate
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spec) * rate / len(x)), float(np.sqrt((x ** 2).mean())), len(x) / rate


@pytest.mark.skipif(BARESIP is None, reason="baresip missing: `make sysdeps`")
@pytest.mark.parametrize(("transport", "mediaenc"),
                         [("udp", None), ("tcp", None), ("tls", None), ("udp", "srtp-mand")],
                         ids=["udp", "tcp", "tls", "sdes-srtp"])
async def test_baresip_hears_its_tone_echoed_and_its_digits_reach_the_agent(
        nursery: trio.Nursery, tmp_path: Path, transport: str, mediaenc: str | None) -> None:
    sip = tls_settings(tmp_path) if transport == "tls" else {}
    stack = await start_phone_stack(nursery, tmp_path, **sip)
    tone = tmp_path / "tone.wav"
    write_tone_wav(tone, freq=700.0, seconds=30.0)
    phone = Baresip(tmp_path / "baresip", tone, mediaenc=mediaenc)
    tr = stack.transceiver
    host, port = stack.phone.tls if transport == "tls" and stack.phone.tls else stack.phone.sip
    uri = f"sip:agent@{host}:{port}" + ("" if transport == "udp" else f";transport={transport}")

    def session() -> Any:
        return next(iter(tr.calls.values()), None)

    try:
        await phone.start(nursery)
        with trio.fail_after(TIMEOUT):
            while session() is None:  # the cons socket may not be up yet: redial is harmless
                await phone.keys(f"/dial {uri}\n")
                with trio.move_on_after(2.0):
                    while session() is None:  # noqa: ASYNC110 - state in other tasks
                        await trio.sleep(0.02)
            ps = session()
            await eventually(lambda: ps.leg is not None and ps.leg.counters.rtp_out >= 100,
                             "two seconds of echo")
            await phone.keys("123")
            await eventually(lambda: ps.dtmf_digits >= 2, "DTMF digits")
            call_id = ps.call_id
            calls = stack.phone.client().realtime.calls
            await trio.to_thread.run_sync(lambda: calls.hangup(call_id))
            await eventually(lambda: not tr.calls, "/hangup ended the media")
            view = await trio.to_thread.run_sync(
                lambda: stack.phone.client().get(f"/realtime/calls/{call_id}", cast_to=object))
    except BaseException:
        print(phone.text)
        raise
    finally:
        await phone.stop()
    assert isinstance(view, dict) and view["status"] == "ended"
    assert view["dtmf"].startswith("12"), view  # RFC 4733 from baresip, via the events op
    ended = tr.ended_phones[-1]
    assert ended["end_reason"] == "sip-ended"
    assert ended["srtp_profile"] == ("AES_CM_128_HMAC_SHA1_80" if mediaenc else None)
    leg = ended["phone"]["leg"]
    assert leg["rtp_in"] >= 100 and leg["rtp_out"] >= 100 and leg["auth_failed"] == 0
    heard = phone.heard()
    assert heard is not None, phone.text
    freq, rms, seconds = wav_peak(heard)
    assert seconds >= 1.5 and rms > 1000, (seconds, rms)
    assert abs(freq - 700.0) < 15, freq  # its own tone, back from the echo agent


@pytest.mark.skipif(SIPP is None, reason="sipp missing: `make sysdeps`")
async def test_sip_info_digits_reach_the_agent_and_the_media_timeout_sends_bye(
        nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from appliance.transceiver import phone_session

    monkeypatch.setattr(phone_session, "MEDIA_TIMEOUT", 1.5)
    stack = await start_phone_stack(nursery, tmp_path)
    write_tone_pcap(tmp_path / "tone.pcap", seconds=0.5)
    tr = stack.transceiver
    digits: list[dict[str, Any]] = []

    def agent_heard() -> bool:  # what the agent's event queue holds (the echo reads none)
        for ps in tr.calls.values():
            digits.extend(e for e in ps.host._events_in if e.get("type") == "dtmf")
        return bool(digits)

    with trio.fail_after(TIMEOUT):
        run = await run_sipp(nursery, stack.phone, "info_then_timeout.xml", cwd=tmp_path)
        await eventually(agent_heard, "the INFO digit at the agent")
        code, out = await run.result()  # it exits 0 only after our BYE came
    assert code == 0, out
    assert digits[0] == {"type": "dtmf", "digit": "5", "duration_ms": 160, "source": "sip-info"}
    assert tr.ended_phones[-1]["end_reason"] == "rtp-timeout"


@pytest.mark.skipif(BARESIP is None, reason="baresip missing: `make sysdeps`")
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("nft") is None,
                    reason="network namespaces and nft need root and nftables")
async def test_baresip_behind_a_masquerading_nat_is_latched_and_hears_the_echo(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    net = NatNet()
    try:
        net.up()
    except (RuntimeError, OSError) as exc:
        net.down()
        pytest.skip(f"cannot build the namespaces here: {exc}")
    phone: Baresip | None = None
    try:
        stack = await start_phone_stack(nursery, tmp_path, host=net.host,
                                        allow=[net.wan_net])
        tone = tmp_path / "tone.wav"
        write_tone_wav(tone, freq=700.0, seconds=30.0)
        phone = Baresip(tmp_path / "baresip", tone, host=net.private, netns=net.phone)
        tr = stack.transceiver
        host, port = stack.phone.sip

        def session() -> Any:
            return next(iter(tr.calls.values()), None)

        await phone.start(nursery)
        with trio.fail_after(TIMEOUT):
            while session() is None:
                await phone.keys(f"/dial sip:agent@{host}:{port}\n")
                with trio.move_on_after(2.0):
                    while session() is None:  # noqa: ASYNC110 - state in other tasks
                        await trio.sleep(0.02)
            ps = session()
            # its SDP names its private address; the SIP (and so the media) came from the
            # NAT's public one: the leg latched to that, as the ADR's NAT rule allows
            assert ps.params.remote[0] == net.private and ps.params.trunk_ip == net.public
            await eventually(lambda: ps.leg is not None and ps.leg.counters.rtp_out >= 100,
                             "two seconds of echo through the NAT")
            latched = ps.latched
            await phone.keys("45")  # a key ends when the next is pressed (cons has no key-up)
            await eventually(lambda: ps.dtmf_digits >= 1, "a digit through the NAT")
            calls = stack.phone.client().realtime.calls
            await trio.to_thread.run_sync(lambda: calls.hangup(ps.call_id))
            await eventually(lambda: not tr.calls, "/hangup ended the media")
    except BaseException:
        if phone is not None:
            print(phone.text)
        print("relay:", stack.relay_stats() if "stack" in locals() else None)
        print("phones:", [p.describe() for p in tr.calls.values()] if "tr" in locals() else None)
        raise
    finally:
        if phone is not None:
            await phone.stop()
        net.down()
    assert latched is not None and latched[0] == net.public
    heard = phone.heard()
    assert heard is not None
    freq, rms, seconds = wav_peak(heard)
    assert seconds >= 1.5 and rms > 1000 and abs(freq - 700.0) < 15, (freq, rms, seconds)
