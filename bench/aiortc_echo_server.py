"""An aiortc voice echo server behind ``POST /v1/sessions``: the baseline for bench/capacity.py
(audio) and bench/datachannel.py (it echoes data channel messages too).

Written the way an aiortc user writes it (the shape of aiortc's ``examples/server``): one
``RTCPeerConnection`` per offer, the received audio track added straight back as the
outgoing track, so aiortc decodes the caller's Opus and encodes it again. The only
deviation from the examples is the HTTP layer: aiohttp is not installed here, so a tiny
asyncio HTTP/1.1 server takes its place (one request per connection, enough for WHIP).

    .venv/bin/python bench/aiortc_echo_server.py --port 8090
    # prints "listening http://127.0.0.1:8090" once ready

``POST /v1/sessions`` (SDP offer) → ``201`` + answer + ``Location``; ``DELETE`` that location
→ ``204``; ``GET /v1/sessions`` → how many peer connections are open.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import uuid

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaRelay

log = logging.getLogger("aiortc_echo")
pcs: dict[str, RTCPeerConnection] = {}
relay = MediaRelay()


async def create_session(offer_sdp: str) -> tuple[str, str]:
    # No STUN server: everything is on this host or LAN (aiortc would otherwise ask Google).
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    session_id = uuid.uuid4().hex
    pcs[session_id] = pc

    @pc.on("track")
    def on_track(track):  # type: ignore[no-untyped-def]
        if track.kind == "audio":
            pc.addTrack(relay.subscribe(track))  # echo

    @pc.on("datachannel")
    def on_datachannel(channel):  # type: ignore[no-untyped-def]
        # Echo every message on the channel it came from (aiortc's examples/server "chat"
        # shape without the ping prefix): the baseline for bench/datachannel.py.
        @channel.on("message")
        def on_message(message):  # type: ignore[no-untyped-def]
            channel.send(message)

    @pc.on("connectionstatechange")
    async def on_state() -> None:
        if pc.connectionState in ("failed", "closed"):
            await pc.close()
            pcs.pop(session_id, None)

    await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
    answer = await pc.createAnswer()
    await pc.setLocalDescription(answer)  # gathers host candidates (no trickle)
    return session_id, pc.localDescription.sdp


async def delete_session(session_id: str) -> bool:
    pc = pcs.pop(session_id, None)
    if pc is None:
        return False
    await pc.close()
    return True


# -- a minimal HTTP/1.1 server ---------------------------------------------------------


def _response(status: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    head = {"Content-Length": str(len(body)), "Connection": "close", **(headers or {})}
    return (f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items())
            + "\r\n").encode("latin-1") + body


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        path = target.split("?", 1)[0]
        if method == "POST" and path == "/v1/sessions":
            try:
                sid, answer = await create_session(body.decode())
            except Exception as exc:  # a bad offer is the client's fault
                out = _response("400 Bad Request", str(exc).encode())
            else:
                out = _response("201 Created", answer.encode(), {
                    "Content-Type": "application/sdp", "Location": f"/v1/sessions/{sid}"})
        elif method == "DELETE" and path.startswith("/v1/sessions/"):
            found = await delete_session(path.rsplit("/", 1)[1])
            out = _response("204 No Content" if found else "404 Not Found")
        elif method == "GET" and path == "/v1/sessions":
            out = _response("200 OK", json.dumps({"sessions": len(pcs), "pid": os.getpid()})
                            .encode(), {"Content-Type": "application/json"})
        else:
            out = _response("404 Not Found")
        writer.write(out)
        await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
            ConnectionError):
        pass
    finally:
        writer.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090, help="0 picks a free port")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    server = await asyncio.start_server(handle, args.host, args.port)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"listening http://{host}:{port}", flush=True)
    try:
        async with server:
            await server.serve_forever()
    finally:
        await asyncio.gather(*(pc.close() for pc in pcs.values()))


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
