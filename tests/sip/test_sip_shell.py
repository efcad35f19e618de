"""The SIP shell's own promises, with in-process peers on loopback: TLS with the
self-signed certificate it makes, CRLF keep-alives, a broken connection ending only itself,
silent drops for refused sources, and the ``--sip*`` flags."""

from __future__ import annotations

import argparse
import secrets
import socket
import ssl
from pathlib import Path

import pytest
import trio
from sip.support import TIMEOUT, Phone, start_phone

from appliance.proto.sip import Decision
from appliance.signaling.options import add_sip_arguments, sip_settings
from appliance.signaling.sip_config import SipSettings, parse_networks


def options(transport: str, local: tuple[str, int], port: int) -> bytes:
    branch = "z9hG4bK" + secrets.token_hex(6)
    return (f"OPTIONS sip:agent@127.0.0.1:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/{transport} {local[0]}:{local[1]};branch={branch}\r\n"
            f"From: <sip:test@{local[0]}>;tag={secrets.token_hex(4)}\r\n"
            f"To: <sip:agent@127.0.0.1:{port}>\r\n"
            f"Call-ID: {secrets.token_hex(8)}@test\r\nCSeq: 1 OPTIONS\r\n"
            "Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n").encode()


async def read_response(stream: trio.abc.Stream) -> bytes:
    buf = b""
    while b"\r\n\r\n" not in buf.lstrip(b"\r\n"):
        chunk = await stream.receive_some(65536)
        assert chunk, f"closed after {buf!r}"
        buf += chunk
    return buf.lstrip(b"\r\n")


async def closed(stream: trio.SocketStream) -> bool:
    """The server closed it (FIN, or RST when it left our bytes unread)."""
    try:
        data = await stream.receive_some(1024)
    except trio.BrokenResourceError:
        data = b""
    await stream.aclose()
    return data == b""


async def udp_options(port: int, host: str = "127.0.0.1") -> bytes:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        await sock.bind((host, 0))
        await sock.sendto(options("UDP", sock.getsockname(), port), ("127.0.0.1", port))
        data, _ = await sock.recvfrom(65535)
    return bytes(data)


async def test_tls_with_the_generated_certificate_and_crlf_pings(nursery: trio.Nursery,
                                                                 tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_sip_arguments(parser)
    parser.add_argument("--state-dir")
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    args = parser.parse_args(["--sip", "127.0.0.1:0", "--sip-tls", "127.0.0.1:0",
                              "--state-dir", str(tmp_path)])
    made = sip_settings(args, ["127.0.0.1"])
    assert made is not None and made.tls_cert is not None
    assert Path(made.tls_cert).parent == tmp_path / "sip"  # not signaling's HTTPS pair
    phone = await start_phone(nursery, tmp_path, tls=made.tls, tls_cert=made.tls_cert,
                              tls_key=made.tls_key)
    assert phone.tls is not None
    ctx = ssl.create_default_context(cafile=made.tls_cert)
    with trio.fail_after(TIMEOUT):
        tcp = await trio.open_tcp_stream(*phone.tls)
        stream = trio.SSLStream(tcp, ctx, server_hostname="127.0.0.1")
        async with stream:
            local = tcp.socket.getsockname()
            await stream.send_all(options("TLS", local, phone.tls[1]))
            resp = await read_response(stream)
            assert resp.startswith(b"SIP/2.0 200 OK\r\n"), resp
            assert b"SIP/2.0/TLS" in resp  # our Via answer is on the dialog's transport
            await stream.send_all(b"\r\n\r\n")  # RFC 5626 keep-alive ping
            assert await stream.receive_some(16) == b"\r\n"


async def test_a_broken_connection_ends_only_itself(nursery: trio.Nursery,
                                                    tmp_path: Path) -> None:
    phone = await start_phone(nursery, tmp_path)
    host, port = phone.sip
    with trio.fail_after(TIMEOUT):
        good = await trio.open_tcp_stream(host, port)
        bad = await trio.open_tcp_stream(host, port)
        # an endless header block: the framer gives up (513) and that stream is closed
        try:
            await bad.send_all(b"OPTIONS sip:x SIP/2.0\r\nX: " + b"a" * 200_000)
        except trio.BrokenResourceError:
            pass  # closed while we were still sending: just as good
        assert await closed(bad)
        local = good.socket.getsockname()
        await good.send_all(options("TCP", local, port))
        assert (await read_response(good)).startswith(b"SIP/2.0 200 OK")
        await good.aclose()
        assert (await udp_options(port)).startswith(b"SIP/2.0 200 OK")


async def test_too_many_connections_are_closed_not_queued(nursery: trio.Nursery,
                                                          tmp_path: Path) -> None:
    phone = await start_phone(nursery, tmp_path, max_connections=1)
    host, port = phone.sip
    with trio.fail_after(TIMEOUT):
        first = await trio.open_tcp_stream(host, port)
        await first.send_all(options("TCP", first.socket.getsockname(), port))
        assert (await read_response(first)).startswith(b"SIP/2.0 200")  # it is registered
        second = await trio.open_tcp_stream(host, port)
        assert await closed(second)  # closed at once
        await first.aclose()


async def test_drop_refused_sends_nothing(nursery: trio.Nursery, tmp_path: Path) -> None:
    """With --sip-drop-refused a refused source hears nothing: its OPTIONS goes in before an
    allowed source's, whose answer proves the first was handled (one socket, in order)."""
    phone = await start_phone(nursery, tmp_path, allow=["127.0.0.1/32"], drop_refused=True)
    port = phone.sip[1]
    stranger = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with stranger, trio.fail_after(TIMEOUT):
        await stranger.bind(("127.0.0.2", 0))
        await stranger.sendto(options("UDP", stranger.getsockname(), port), ("127.0.0.1", port))
        assert (await udp_options(port)).startswith(b"SIP/2.0 200 OK")
        with pytest.raises(BlockingIOError):
            stranger._sock.recv(65535, socket.MSG_DONTWAIT)  # type: ignore[attr-defined]


def test_allow_hook() -> None:
    s = SipSettings(udp_tcp=("127.0.0.1", 5060))
    hook = s.allow_hook()
    assert hook("127.0.0.1") is Decision.ALLOW and hook("::1") is Decision.ALLOW
    assert hook("192.0.2.7") is Decision.REFUSE and hook("not an ip") is Decision.REFUSE
    s.allow, s.drop_refused = parse_networks(["192.0.2.0/24"]), True
    hook = s.allow_hook()
    assert hook("192.0.2.7") is Decision.ALLOW and hook("::ffff:192.0.2.9") is Decision.ALLOW
    assert hook("127.0.0.1") is Decision.DROP  # --sip-allow replaces the loopback default
    with pytest.raises(ValueError, match="CIDR"):
        parse_networks(["10.0.0.0/33"])


@pytest.mark.parametrize("argv", [["--sip-agent", "echo"], ["--sip-tls", "0.0.0.0:5061"]])
def test_sip_flags_need_sip(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    add_sip_arguments(parser)
    with pytest.raises(ValueError, match="needs --sip"):
        sip_settings(parser.parse_args(argv), ["192.0.2.1"])


def test_sip_is_off_by_default_and_any_address_uses_the_public_one() -> None:
    parser = argparse.ArgumentParser()
    add_sip_arguments(parser)
    assert sip_settings(parser.parse_args([]), ["192.0.2.1"]) is None
    got = sip_settings(parser.parse_args(["--sip", "0.0.0.0:5060", "--sip-allow",
                                          "198.51.100.0/24", "--sip-answer-timeout", "5"]),
                       ["192.0.2.1"])
    assert got is not None and got.sip_host == "192.0.2.1" and got.answer_timeout == 5
    assert [str(n) for n in got.allow] == ["198.51.100.0/24"]


def hangups(phone: Phone) -> tuple[object, object]:
    import openai

    calls = phone.client().realtime.calls
    out = []
    for call_id in ("rtc_sip_" + "0" * 24, "rtc_not_a_sip_call"):
        try:
            calls.hangup(call_id)
        except openai.NotFoundError as exc:
            out.append(exc.body)
    return out[0], out[1]


async def test_hangup_answers_sip_ids_and_lets_others_fall_through(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    phone = await start_phone(nursery, tmp_path)
    with trio.fail_after(TIMEOUT):
        ours, theirs = await trio.to_thread.run_sync(hangups, phone)
    assert isinstance(ours, dict) and "no SIP call" in ours["message"]
    assert isinstance(theirs, dict) and "SIP" not in theirs["message"]  # realtime_http's 404


def test_up_and_signaling_take_the_same_sip_flags(tmp_path: Path) -> None:
    from appliance.config import resolve
    from appliance.signaling import cli as signaling_cli
    from appliance.supervisor import DEFAULTS, add_arguments, build_up_config

    flags = ["--sip", "0.0.0.0:5070", "--sip-tls", "0.0.0.0:5071", "--sip-allow",
             "198.51.100.0/24", "--sip-drop-refused", "--public-address", "192.0.2.9",
             "--state-dir", str(tmp_path / "state")]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(flags)
    resolve(args, {}, "up", DEFAULTS)
    up = build_up_config(args).sip
    parser = argparse.ArgumentParser()
    signaling_cli.add_arguments(parser)
    args = parser.parse_args(flags)
    resolve(args, {}, "signaling", signaling_cli.DEFAULTS)
    sig = signaling_cli.build_config(args)[0].sip
    for got in (up, sig):
        assert got is not None and got.udp_tcp == ("0.0.0.0", 5070)
        assert got.tls == ("0.0.0.0", 5071) and got.drop_refused
        assert got.sip_host == "192.0.2.9"  # bound to any address: the advertised one
        assert got.tls_cert == str(tmp_path / "state" / "sip" / "signaling-cert.pem")
        assert got.allow_hook()("127.0.0.1") is Decision.DROP
