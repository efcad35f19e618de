"""Webhooks: call lifecycle events POSTed to ``--webhook-url`` endpoints, signed per
Standard Webhooks (the scheme OpenAI's webhooks and ``client.webhooks.unwrap`` use).

Signing (:func:`sign`): ``webhook-signature: v1,<base64(HMAC-SHA256(key, id "." timestamp
"." body))>`` where ``key`` is the base64 part of the endpoint's ``whsec_…`` secret, with
``webhook-id`` (``evt_…``, the same on every retry of one event, so a receiver can drop
duplicates) and ``webhook-timestamp`` (Unix seconds of this attempt).

Events (OpenAI's envelope: ``{"id", "object": "event", "created_at", "type", "data"}``;
OpenAI names only ``realtime.call.incoming``, which belongs to the phone path — the two
here are the appliance's, named in the same family):

* ``realtime.call.started`` — ``data``: ``call_id``, ``transport`` (``webrtc`` | ``websocket``),
  ``agent``, ``model``;
* ``realtime.call.ended`` — ``data``: the same plus the end-of-call ``report``: ``started_at``,
  ``ended_at``, ``duration_seconds``, ``end_reason``, ``hung_up_by`` (``client`` | ``api`` |
  ``agent`` | ``server`` | ``unknown``), ``stats`` (the session object's media and
  network counters for a WebRTC or phone call — a phone call's with its RTP leg's counters —
  the socket's event/byte counts for a WebSocket), ``transcript`` and ``turns`` (each
  turn's waterfall, as the agent reported it in ``turn.metrics``); a phone call's also
  ``sip`` (:func:`sip_report`: Call-ID, From, To, hangup cause);
* ``live.transport.connected`` (GPT-Live's, the SDK's shape) — ``data``: ``session_id``,
  ``type`` (``webrtc``), once per WebRTC Live session, beside its ``realtime.call.started``
  (live_http.py);
* ``realtime.call.incoming`` and GPT-Live's ``live.transport.incoming`` — both for one
  trunk INVITE, ``data`` ``{call_id, sip_headers}`` and ``{session_id, type: "sip",
  sip_headers, sip_media_security}`` (sip_calls.py). Endpoints have no subscriptions (each
  gets every event), so the deprecated ``live.call.incoming`` — OpenAI's for existing
  subscriptions only — is not sent.

Delivery (:class:`WebhookQueue`, sans-IO; :func:`deliver_forever`, the trio task): a bounded
queue — a full queue drops the new event and counts it, it never blocks signaling — one
attempt at a time per endpoint, retried on a non-2xx answer or a connection error with
exponential backoff (:data:`BACKOFF_S` doubling to :data:`BACKOFF_MAX_S`, at most
:data:`MAX_ATTEMPTS` attempts). Secrets are never logged; URLs are logged without query.

The HTTP client (:func:`post`) is h11 (the HTTP/1.1 core hypercorn serves with) over a trio
stream, TLS with the system's trust store for ``https``: one POST per connection
(``Connection: close``), whose answer is its status code — read from the response head, the
body never; a redirect is not followed (a 3xx is not a 2xx: retried like any failure); an
attempt gets :data:`ATTEMPT_TIMEOUT_S` in all; a response that breaks HTTP/1.1 is a
``ValueError`` (:func:`response_status_untrusted`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import math
import os
import secrets
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import h11
import trio

log = logging.getLogger(__name__)
SECRET_PREFIX = "whsec_"
MAX_QUEUE = 1000  # events waiting, over all endpoints
MAX_ATTEMPTS = 8
BACKOFF_S = 1.0
BACKOFF_MAX_S = 300.0
ATTEMPT_TIMEOUT_S = 10.0
MAX_RESPONSE_HEAD = 16 * 1024  # status line and headers; a longer head is a ValueError
USER_AGENT = "appliance-webhooks"
CALL_STARTED = "realtime.call.started"
CALL_ENDED = "realtime.call.ended"
#: GPT-Live's (the SDK's ``LiveTransportConnectedWebhookEvent``): ``data`` is exactly
#: ``{"session_id", "type": "webrtc"}``, sent once per WebRTC Live session when
#: ``POST /v1/live/sessions`` has placed it and written its answer — the SDK's "sent when a
#: direct Live WebRTC session is created"; its id is the one to attach a sideband with.
LIVE_TRANSPORT_CONNECTED = "live.transport.connected"


class WebhookConfigError(ValueError):
    """A ``--webhook-url`` / secret that cannot be used (the message never holds the secret)."""


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret."""
    secret = secret.strip()
    if not secret.startswith(SECRET_PREFIX):
        raise WebhookConfigError("a webhook secret must start with whsec_")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise WebhookConfigError("the webhook secret after whsec_ is not base64") from None
    if len(key) < 16:
        raise WebhookConfigError("the webhook secret is shorter than 16 bytes")
    return key


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode("ascii")


def signed_headers(key: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(key, msg_id, timestamp, body)}


@dataclass(frozen=True, slots=True)
class Endpoint:
    url: str
    key: bytes = field(repr=False)

    @property
    def safe_url(self) -> str:
        """The URL without its query (which may hold a token), for logs."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}{parts.path}"


def parse_endpoint(spec: str, env: dict[str, str] | None = None) -> Endpoint:
    """``URL`` with its secret: ``URL,secret-file=PATH`` or ``URL,secret-env=NAME``
    (default: the environment variable ``APPLIANCE_WEBHOOK_SECRET``)."""
    env = dict(os.environ) if env is None else env
    url, _, rest = spec.partition(",")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookConfigError(f"webhook URL must be http(s)://host/…, got {url[:64]!r}")
    source, _, value = rest.partition("=")
    if not rest:
        source, value = "secret-env", "APPLIANCE_WEBHOOK_SECRET"
    if source == "secret-file":
        try:
            secret = Path(value).read_text()
        except OSError as exc:
            raise WebhookConfigError(f"cannot read the webhook secret file {value}: "
                                     f"{exc.strerror}") from None
    elif source == "secret-env":
        if value not in env:
            raise WebhookConfigError(f"the webhook secret variable {value} is not set")
        secret = env[value]
    else:
        raise WebhookConfigError("after the webhook URL: ,secret-file=PATH or ,secret-env=NAME")
    return Endpoint(url, secret_key(secret))


def event(kind: str, data: dict[str, Any], *, now: float) -> dict[str, Any]:
    return {"id": "evt_" + secrets.token_hex(12), "object": "event",
            "created_at": math.floor(now), "type": kind, "data": data}


@dataclass(slots=True)
class Delivery:
    endpoint: int  # index into the queue's endpoints
    msg_id: str
    body: bytes
    attempts: int = 0
    due: float = 0.0


def hung_up_by(reason: str) -> str:
    """Who ended it, from the session's end reason (the transceiver's: "dtls-closed",
    "consent-expired", "agent-done", "agent: …"; signaling's: "hangup", "deleted", …)."""
    if reason in ("hangup", "deleted"):
        return "api"
    if reason in ("client_closed", "dtls-closed", "consent-expired", "ice-timeout"):
        return "client"  # the caller closed, or went away (no consent, ICE never completed)
    if reason.startswith("agent"):
        return "agent"
    if reason in ("slow_reader", "transceiver lost", "gone", "shutdown", "internal-error"):
        return "server"
    return "unknown"


def end_report(*, started_at: float, ended_at: float, reason: str,
               stats: dict[str, Any] | None = None, session: Any = None,
               recording: dict[str, Any] | None = None, transcript: Any = None,
               turns: Any = None, by: str | None = None,
               sip: dict[str, Any] | None = None) -> dict[str, Any]:
    """The end-of-call ``report`` of every surface (WebRTC, WebSocket, Live, inbound and
    outbound SIP): the one builder, so each carries the same keys in the same order.

    ``session``: the media's session object (session_info.py) when the call had one — a
    WebRTC call's registry view, a phone call's as its media ended: ``stats``
    (:func:`report_stats`), ``transcript`` and ``turns`` come from it unless given (a
    WebSocket session passes its own ``stats`` and ``turns``). ``recording``:
    :func:`recording_link`'s, or None when the call was not recorded. ``transcript``: the
    lines (``[{"who", "text", "at"}]``, the newest 50) when its agent reported any;
    ``turns``: its turn waterfalls (``[{"turn", "speech_start_ms", …, "first_sent_ms"}]``,
    the newest 50, each mark in ms after that turn's end was decided: session_info.py
    ``turn_line``) when its agent reported any; anything else becomes None. ``by``: who hung
    up, when the caller knows (a SIP call's record does); else :func:`hung_up_by` of the
    reason. ``sip``: :func:`sip_report`'s, for a phone call (the key is there only then)."""
    if stats is None:
        stats = report_stats(session)
    if isinstance(session, dict):
        transcript = session.get("transcript") if transcript is None else transcript
        turns = session.get("turns") if turns is None else turns
    lines = [dict(t) for t in transcript if isinstance(t, dict)] if isinstance(
        transcript, list) else []
    waterfalls = [dict(t) for t in turns if isinstance(t, dict)] if isinstance(
        turns, list) else []
    report = {"started_at": started_at, "ended_at": ended_at,
              "duration_seconds": round(max(0.0, ended_at - started_at), 3),
              "end_reason": reason, "hung_up_by": by if by is not None else hung_up_by(reason),
              "stats": stats, "recording": recording, "transcript": lines or None,
              "turns": waterfalls or None}
    if sip is not None:
        report["sip"] = sip
    return report


#: the session object's fields an end-of-call report's ``stats`` carries (WebRTC and phone)
REPORT_STATS = ("packets_in", "packets_out", "bytes_in", "bytes_out", "rtt_ms", "jitter_ms",
                "loss", "codec", "datachannels")


def report_stats(session: Any) -> dict[str, Any]:
    """``stats`` from a session object (a phone call's also has ``phone``: its RTP leg's
    counters and DTMF digits); ``{}`` when there is none."""
    if not isinstance(session, dict):
        return {}
    out = {k: session.get(k) for k in REPORT_STATS}
    phone = session.get("phone")
    if isinstance(phone, dict):
        out["srtp_profile"] = session.get("srtp_profile")
        out["leg"] = phone.get("leg")
        out["dtmf_digits"] = phone.get("dtmf_digits")
    return out


def sip_report(*, direction: str, sip_call_id: str | None, from_: str | None,
               to: str | None, cause: str, dtmf: str) -> dict[str, Any]:
    """A phone call's end-of-call ``report.sip``: the SIP ``Call-ID``, ``From`` and ``To`` as
    the INVITE carried them (untrusted text from the trunk; for a call we placed, the Call-ID
    the SIP core generated), ``direction``, ``hangup_cause`` (the SIP core's end reason
    — ``bye``, ``hangup``, ``cancelled``, ``no ACK``, ``<status> to …`` — or, when the media
    ended the call, the transceiver's: ``rtp-timeout``, ``agent-done``, …) and the DTMF
    digits signaling saw."""
    return {"direction": direction, "call_id": sip_call_id, "from": from_, "to": to,
            "hangup_cause": cause, "dtmf": dtmf[-64:]}


def recording_link(call_id: str, media: Any) -> dict[str, Any] | None:
    """The end-of-call report's ``recording`` for a call whose session object's ``media``
    says it was recorded (docs/recordings.md): the path to fetch it with the API token —
    relative to the appliance's base URL, which a receiver knows and signaling may not
    (proxies) — and the recording's state when the transceiver last reported it. The file
    is complete a moment after the call ends: fetching sooner answers 404
    ``recording_in_progress``."""
    rec = media.get("recording") if isinstance(media, dict) else None
    if not isinstance(rec, dict):
        return None
    return {"url": f"/v1/realtime/calls/{call_id}/recording", "format": "audio/wav",
            "state": rec.get("state"), "reason": rec.get("reason")}


class WebhookQueue:
    """Deliveries waiting and their retry schedule, with time as an input (sans-IO)."""

    def __init__(self, endpoints: list[Endpoint], *, limit: int = MAX_QUEUE,
                 backoff: float = BACKOFF_S, backoff_max: float = BACKOFF_MAX_S,
                 max_attempts: int = MAX_ATTEMPTS) -> None:
        self.endpoints = endpoints
        self._limit = limit
        self._backoff, self._backoff_max, self._max = backoff, backoff_max, max_attempts
        self._waiting: deque[Delivery] = deque()
        self._busy: set[int] = set()  # endpoints with an attempt in flight
        self.dropped = 0
        self.delivered = 0
        self.failed = 0

    def __len__(self) -> int:
        return len(self._waiting)

    def handle_event(self, now: float, obj: dict[str, Any]) -> bool:
        """Queue one event for every endpoint; False (and counted) if there is no room."""
        if len(self._waiting) + len(self.endpoints) > self._limit:
            self.dropped += 1
            return False
        body = json.dumps(obj, separators=(",", ":")).encode()
        for i in range(len(self.endpoints)):
            self._waiting.append(Delivery(i, str(obj["id"]), body, 0, now))
        return True

    def poll_delivery(self, now: float) -> Delivery | None:
        """The next attempt due now for an endpoint that has none in flight."""
        for d in self._waiting:
            if d.due <= now and d.endpoint not in self._busy:
                self._waiting.remove(d)
                self._busy.add(d.endpoint)
                d.attempts += 1
                return d
        return None

    def poll_timeout(self) -> float | None:
        free = [d.due for d in self._waiting if d.endpoint not in self._busy]
        return min(free) if free else None

    def handle_result(self, now: float, d: Delivery, ok: bool) -> None:
        self._busy.discard(d.endpoint)
        if ok:
            self.delivered += 1
            return
        if d.attempts >= self._max:
            self.failed += 1
            log.warning("webhook %s to %s failed %d times: dropped", d.msg_id,
                        self.endpoints[d.endpoint].safe_url, d.attempts)
            return
        d.due = now + min(self._backoff * 2 ** (d.attempts - 1), self._backoff_max)
        self._waiting.appendleft(d)  # the endpoint's next attempt: keep its order


def request_bytes(conn: h11.Connection, url: str, headers: dict[str, str], body: bytes) -> bytes:
    """The whole POST of ``body`` to ``url`` as ``conn`` (a client connection) writes it."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    authority = host if parts.port is None else f"{host}:{parts.port}"
    request = h11.Request(method="POST", target=target, headers=[
        ("Host", authority), ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))), ("User-Agent", USER_AGENT),
        ("Connection", "close"), *headers.items()])
    out = conn.send(request) or b""
    out += conn.send(h11.Data(data=body)) or b""
    return out + (conn.send(h11.EndOfMessage()) or b"")


def response_status_untrusted(conn: h11.Connection, data: bytes) -> int | None:
    """Feed the server's bytes (``b""``: it closed); the final status code once the response
    head is in (1xx are skipped), None while more is needed. A response that breaks HTTP/1.1,
    or a connection closed before one, raises ValueError (h11's errors converted here)."""
    try:
        conn.receive_data(data)
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                return None
            if isinstance(event, h11.Response):
                return int(event.status_code)
            if not isinstance(event, h11.InformationalResponse):  # 100 Continue, …: skipped
                raise ValueError(f"no response: {type(event).__name__}")
    except h11.ProtocolError as exc:
        raise ValueError(f"bad HTTP response: {exc}") from None


async def post(url: str, headers: dict[str, str], body: bytes) -> int:
    """One HTTP/1.1 POST (``Connection: close``); the answer's status code."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
    if parts.scheme == "https":
        stream = trio.SSLStream(stream, ssl.create_default_context(), server_hostname=host)
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_RESPONSE_HEAD)
    async with stream:
        await stream.send_all(request_bytes(conn, url, headers, body))
        while True:
            status = response_status_untrusted(conn, bytes(await stream.receive_some(4096)))
            if status is not None:
                return status


Poster = Callable[[str, dict[str, str], bytes], Any]


class Webhooks:
    """The signaling side: queue events (never blocks) and run the delivery task."""

    def __init__(self, endpoints: list[Endpoint], *, clock: Callable[[], float],
                 poster: Poster = post, **queue_args: Any) -> None:
        self.queue = WebhookQueue(endpoints, **queue_args)
        self.clock = clock
        self._post = poster
        self._wake = trio.Event()
        self.pending_calls: dict[str, dict[str, Any]] = {}  # WebRTC calls not yet seen ended

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        if not self.queue.endpoints:
            return
        self.queue.handle_event(trio.current_time(), event(kind, data, now=self.clock()))
        self._wake.set()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                now = trio.current_time()
                while (d := self.queue.poll_delivery(now)) is not None:
                    nursery.start_soon(self._attempt, d)
                timeout = self.queue.poll_timeout()
                with trio.move_on_at(math.inf if timeout is None else timeout):
                    await self._wake.wait()
                self._wake = trio.Event()

    async def _attempt(self, d: Delivery) -> None:
        ep = self.queue.endpoints[d.endpoint]
        ok = False
        try:
            with trio.fail_after(ATTEMPT_TIMEOUT_S):
                status = await self._post(ep.url, signed_headers(
                    ep.key, d.msg_id, math.floor(self.clock()), d.body), d.body)
            ok = 200 <= status < 300
            if not ok:
                log.info("webhook %s to %s: HTTP %s (attempt %d)", d.msg_id, ep.safe_url,
                         status, d.attempts)
        except (OSError, ValueError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            log.info("webhook %s to %s: %s (attempt %d)", d.msg_id, ep.safe_url,
                     type(exc).__name__, d.attempts)
        self.queue.handle_result(trio.current_time(), d, ok)
        self._wake.set()
