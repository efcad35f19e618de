"""An outbound phone call with real audio both ways (issue 28 item 5): ``POST
/v1/realtime/calls/sip`` places a call through a configured trunk whose far end is
baresip, a real softphone, answering on its own (``answermode=auto``); the echo agent
answers on a transceiver behind a relay worker (tests/sip/support.py ``start_phone_stack``).
baresip plays a 700 Hz tone as its microphone and records what it hears: hearing its own
tone back (FFT of the recording) means audio went callee -> relay -> transceiver -> agent
and agent -> transceiver -> relay -> callee. ``/hangup`` ends it: the BYE comes from us.

Every wait is on a condition (the call's state from the API, the transceiver's tables).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from sip.support import (
    BARESIP,
    TIMEOUT,
    Baresip,
    start_phone_stack,
    write_tone_wav,
)
from sip.test_sip_media import wav_peak

from appliance.signaling.sip_trunks import Trunk
from appliance.signaling.webhooks import CALL_ENDED

pytestmark = [pytest.mark.interop,
              pytest.mark.skipif(BARESIP is None, reason="baresip missing: `make sysdeps`")]

TONE_HZ = 700.0


async def eventually(pred: Any, what: str) -> None:
    with trio.fail_after(TIMEOUT):
        while not pred():  # noqa: ASYNC110 - polling state that lives in other tasks
            await trio.sleep(0.02)


def _listening(port: int) -> bool:
    """Whether a UDP socket is bound to 127.0.0.1:port, from /proc (no probe packet)."""
    want = f"0100007F:{port:04X}"
    return any(line.split()[1] == want
               for line in Path("/proc/net/udp").read_text().splitlines()[1:])


def auto_answering(home: Path, tone: Path) -> tuple[Baresip, int]:
    """baresip (support.Baresip's config) that answers calls itself; returns its SIP port."""
    phone = Baresip(home, tone)
    accounts = home / "accounts"
    accounts.write_text(accounts.read_text().rstrip("\n") + ";answermode=auto\n")
    listen = next(ln for ln in (home / "config").read_text().splitlines()
                  if ln.startswith("sip_listen "))
    return phone, int(listen.rsplit(":", 1)[1])


async def test_outbound_call_to_baresip_hears_the_echo_both_ways(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    tone = tmp_path / "tone.wav"
    write_tone_wav(tone, freq=TONE_HZ, seconds=30.0)
    callee, port = auto_answering(tmp_path / "baresip", tone)
    trunk = Trunk(name="pbx", host="127.0.0.1", port=port, transport="udp",
                  from_user="+15550001111")
    stack = await start_phone_stack(nursery, tmp_path, webhooks=True, trunks={"pbx": trunk})
    phone, tr = stack.phone, stack.transceiver
    client = phone.client()

    def view(call_id: str) -> Any:
        return client.get(f"/realtime/calls/{call_id}", cast_to=object)

    async def until_status(call_id: str, *statuses: str) -> dict[str, Any]:
        while True:
            got = await trio.to_thread.run_sync(view, call_id)
            if got["status"] in statuses:
                return got  # type: ignore[no-any-return]
            await trio.sleep(0.05)

    def session() -> Any:
        return next(iter(tr.calls.values()), None)

    try:
        await callee.start(nursery)
        with trio.fail_after(TIMEOUT):
            await eventually(lambda: _listening(port), "baresip's SIP socket")
            call = await trio.to_thread.run_sync(lambda: client.post(
                "/realtime/calls/sip", body={"to": "baresip", "agent": "echo"},
                cast_to=object))
            assert isinstance(call, dict) and call["direction"] == "outbound", call
            got = await until_status(call["id"], "active", "failed", "ended")
            assert got["status"] == "active", got  # baresip answered by itself
            call_id = call["id"]
            ps = session()
            assert ps is not None and ps.call_id == call_id
            # three seconds each way through the relay
            await eventually(lambda: ps.leg is not None and ps.leg.counters.rtp_in >= 150
                             and ps.leg.counters.rtp_out >= 150, "three seconds of echo")
            await trio.to_thread.run_sync(
                lambda: client.post(f"/realtime/calls/{call_id}/hangup", cast_to=object))
            ended = await until_status(call_id, "ended")
            await eventually(lambda: not tr.calls, "/hangup ended the media")
            assert phone.receiver is not None
            report = (await phone.receiver.wait_for(CALL_ENDED))["data"]["report"]
    except BaseException:
        print(callee.text)
        raise
    finally:
        await callee.stop()
    assert ended["hung_up_by"] == "api" and ended["started_at"] is not None, ended
    leg = tr.ended_phones[-1]["phone"]["leg"]
    assert leg["rtp_in"] >= 150 and leg["rtp_out"] >= 150 and leg["stray"] == 0, leg
    assert report["sip"]["direction"] == "outbound" and report["stats"]["leg"] == leg
    heard = callee.heard()
    assert heard is not None, callee.text
    freq, rms, seconds = wav_peak(heard)
    assert seconds >= 2.0 and rms > 1000, (seconds, rms)
    assert abs(freq - TONE_HZ) < 15, freq  # its own tone, back from the agent
