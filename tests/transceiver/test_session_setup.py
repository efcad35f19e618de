"""What a transceiver does per setup, and when (docs/performance.md, "Setup time"): the
`create` answer carries no work that can wait until the answer is on its way."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from transceiver.support import Client

from appliance.control import control_request
from appliance.transceiver import media as media_mod
from appliance.transceiver import session as session_mod
from appliance.transceiver.opus import OpusEncoder
from appliance.transceiver.server import TransceiverAddresses, TransceiverConfig, serve_transceiver

SECRETS = (b"routing-secret-for-tests-0123456",)


class _Counting:
    """Wraps a codec class; ``made`` says how many it has made and when (``in_create``)."""

    def __init__(self, cls: Any, in_create: list[bool]) -> None:
        self.cls, self.in_create = cls, in_create
        self.made: list[bool] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.made.append(self.in_create[0])
        return self.cls(*args, **kwargs)


@pytest.mark.parametrize("agent", ["echo", "passthrough"])
async def test_create_answers_before_the_codec_is_made(
    tmp_path: Path, relay_sock: socket.socket, monkeypatch: pytest.MonkeyPatch, agent: str,
) -> None:
    """Regression (setup time): each session's two libopus states (~0.1-0.3 ms) were made
    inside `create`, so a burst of 20 POSTs had every answer wait for the codecs of all the
    creates queued before it. They are now made by the session's task after the answer is
    out, once each, and never for a passthrough session; the call still echoes."""
    in_create = [False]
    dec = _Counting(media_mod.OpusDecoder, in_create)
    enc = _Counting(media_mod.OpusEncoder, in_create)
    monkeypatch.setattr(media_mod, "OpusDecoder", dec)
    monkeypatch.setattr(media_mod, "OpusEncoder", enc)
    config = TransceiverConfig(id=3, secrets=SECRETS, listen=("127.0.0.1", 0),
                               control=str(tmp_path / "t.sock"))
    async with trio.open_nursery() as nursery:
        addrs: TransceiverAddresses = await nursery.start(serve_transceiver, config)
        assert addrs.control is not None and addrs.transceiver is not None
        tr = addrs.transceiver
        real_create = tr._op_create

        def create(req: dict[str, Any]) -> dict[str, Any]:
            in_create[0] = True
            try:
                return real_create(req)
            finally:
                in_create[0] = False

        monkeypatch.setattr(tr, "_op_create", create)
        client = Client(relay_sock, addrs.udp)
        resp = await control_request(addrs.control, {
            "op": "create", "session_id": "c1", "offer": client.offer(), "agent": agent,
            "candidates": [["198.51.100.1", 3478]]})
        assert resp["ok"], resp
        await trio.testing.wait_all_tasks_blocked()
        want = [] if agent == "passthrough" else [False]
        assert (dec.made, enc.made) == (want, want)  # made once, after create returned
        session = tr.calls["c1"]
        assert (session.decoder is None) == (agent == "passthrough")
        client.start(resp["answer"], trio.current_time())
        with trio.fail_after(5):
            while client.srtp is None:
                await client.pump(trio.current_time())
                await trio.sleep(0.005)
            encoder = OpusEncoder()  # the module's own, not the counted one
            for _ in range(3):
                await client.send_audio(bytes(1920), encoder)
            while not client.received_rtp:
                await client.pump(trio.current_time())
                await trio.sleep(0.005)
        assert (dec.made, enc.made) == (want, want)  # still the same ones
        nursery.cancel_scope.cancel()


async def test_codec_is_made_on_first_use_if_the_task_has_not_run() -> None:
    """The session's task normally makes the codec; media that somehow comes first (or a
    caller reading ``encoder``) gets one made on the spot, once."""
    session = _bare_session("echo")
    pipeline = session.pipeline
    assert pipeline is not None
    assert pipeline._decoder is None and pipeline._encoder is None
    enc = session.encoder
    assert enc is not None and session.encoder is enc
    assert session.decoder is not None and session.decoder is pipeline._decoder
    assert _bare_session("passthrough").encoder is None


def _bare_session(agent: str) -> session_mod.Session:
    from appliance.agents import resolve
    from appliance.proto.dtls import Certificate, DtlsConnection, Role
    from appliance.proto.sdp import build_answer, parse_offer_untrusted

    cert = Certificate.generate(0.0)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        offer = parse_offer_untrusted(Client(sock, ("127.0.0.1", 9)).offer())
    answer = build_answer(offer, ice_ufrag="u" * 16, ice_pwd="p" * 24,
                          fingerprint=cert.fingerprint, candidates=[("198.51.100.1", 3478)],
                          ssrc=1, cname="c", session_id=1, prefer_active=False)
    return session_mod.Session(
        session_id="x", transceiver=0, agent=resolve(agent), answer=answer,
        candidates=[("198.51.100.1", 3478)], local_ufrag="u" * 16, local_pwd="p" * 24,
        dtls=DtlsConnection(Role.SERVER, cert, remote_fingerprints=None), ssrc=1, cname="c",
        send=lambda data, addr: None, now=0.0, on_end=lambda s: None, counters={})
