"""Prometheus text exposition (format 0.0.4) for ``GET /metrics``.

Families:

* ``appliance_sessions{state}`` — gauge, sessions by state summed over the transceivers'
  ``stats`` (what they hold now), plus ``appliance_sessions_lost_total``;
* ``appliance_session_setup_seconds{step}`` — histogram of the setup timeline, one
  observation per session and step (offer received → answer sent, ICE nominated, DTLS done,
  first RTP in/out), taken the first time signaling sees that step;
* ``appliance_turn_<span>_seconds`` — histograms of the turns' waterfalls (the agent's
  ``turn.metrics``, kept in the session objects' ``turns``), one observation per turn and
  span, timed from the caller's end of speech: ``speech`` (how long the caller spoke),
  ``end_of_turn``, ``transcript``, ``first_token``, ``first_audio`` and ``first_sent`` (the
  pause the caller hears); registry.py ``TURN_SPANS``;
* ``appliance_transceiver_<counter>_total{transceiver}`` and
  ``appliance_relay_<counter>_total{worker}`` — the peers' own counters from ``stats``,
  nested objects flattened with ``_`` (``drops: {bad_proxy: 3}`` → ``drops_bad_proxy``);
* ``appliance_datachannels_open`` and ``appliance_datachannel_associations{sctp}`` —
  gauges over the live sessions' ``datachannels`` objects (GET /v1/sessions/{id});
  ``appliance_datachannel_messages_total{direction}``, ``…_bytes_total{direction}`` and
  ``…_messages_dropped_total`` — counters summed from them, kept monotonic by
  :class:`ChannelTotals` across sessions that end and are purged;
* headroom and admission (issue 23; docs/operations.md "Admission"), per transceiver:
  ``appliance_transceiver_busy_ratio`` (smoothed CPU share of its core, what admission
  uses), ``…_cpu_ratio`` (the last window's), ``…_loop_lag_max_seconds``,
  ``…_opus_complexity``, and signaling's ``…_headroom_ratio``, ``…_room_calls``,
  ``…_call_cost_ratio``, ``…_neighbour_cost_ratio``; ``appliance_admission_refused_total``
  (POSTs answered 503
  ``overloaded``);
* phone calls (``--sip``; docs/sip.md "Metrics"): ``appliance_sip_endpoint_total{event}``
  (the SIP core's refusals and drops: ``malformed``, ``refused-source``, ``dropped-source``,
  ``rate-limited``, ``invite-cap``, ``table-full``, ``too-large-to-answer``, …),
  ``appliance_sip_shell_total{event}`` (sockets and connections), ``appliance_sip_calls_total
  {direction,event}`` (call control's counts: placed, answered, failed-busy, rejected-488,
  …), and gauges ``appliance_sip_calls{direction}``, ``appliance_sip_transactions{kind}``,
  ``appliance_sip_pending_invites``, ``appliance_sip_connections``;
* ``appliance_relay_flows{worker}``, ``appliance_process_up{role,id}``,
  ``appliance_process_restarts_total{role,id}``, ``appliance_http_responses_total{code}``.
"""

from __future__ import annotations

import math
import re
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from .histogram import Histogram
from .sip_calls import SipCalls
from .sip_server import SipService
from .state import SignalingState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(text: str) -> str:
    name = _NAME_BAD.sub("_", text).strip("_").lower()
    return name if name and not name[0].isdigit() else f"_{name}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
    return "{" + inner + "}"


def _num(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def flatten(obj: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, float]]:
    """Numeric leaves of a (nested) counters object, names joined with ``_``."""
    for key, value in obj.items():
        name = f"{prefix}_{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            yield from flatten(value, name)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            if math.isfinite(value):
                yield metric_name(name), value


class _Families:
    """Collects samples by family so each family's HELP/TYPE is written once."""

    def __init__(self) -> None:
        self._fams: dict[str, tuple[str, str, list[str]]] = {}

    def add(self, name: str, kind: str, help_text: str, labels: Mapping[str, str], value: float) -> None:
        fam = self._fams.setdefault(name, (kind, help_text, []))
        fam[2].append(f"{name}{_labels(labels)} {_num(value)}")

    def add_raw(self, family: str, kind: str, help_text: str, line: str) -> None:
        self._fams.setdefault(family, (kind, help_text, []))[2].append(line)

    def render(self) -> str:
        out: list[str] = []
        for name, (kind, help_text, lines) in self._fams.items():
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(lines)
        return "\n".join(out) + "\n"


#: The counters of a session's ``datachannels`` object (appliance/session_info.py) that
#: /metrics sums, and the (family, labels) each one adds to.
_DC_COUNTERS: dict[str, tuple[str, dict[str, str]]] = {
    "messages_in": ("appliance_datachannel_messages_total", {"direction": "in"}),
    "messages_out": ("appliance_datachannel_messages_total", {"direction": "out"}),
    "bytes_in": ("appliance_datachannel_bytes_total", {"direction": "in"}),
    "bytes_out": ("appliance_datachannel_bytes_total", {"direction": "out"}),
    "messages_dropped": ("appliance_datachannel_messages_dropped_total", {}),
}

_DC_HELP = {
    "appliance_datachannel_messages_total": "Data-channel messages, summed over sessions.",
    "appliance_datachannel_bytes_total": "Data-channel message bytes, summed over sessions.",
    "appliance_datachannel_messages_dropped_total":
        "Data-channel messages dropped (the agent's queue was full), summed over sessions.",
}


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class ChannelTotals:
    """Data-channel counters summed over sessions, monotonic (a Prometheus counter must
    not fall): each session adds what its counters grew by since the last scrape, and a
    session that ends and leaves the registry keeps what it added."""

    def __init__(self) -> None:
        self.totals = dict.fromkeys(_DC_COUNTERS, 0)
        self._seen: dict[str, dict[str, int]] = {}

    def update(self, views: Iterable[Mapping[str, Any]]) -> tuple[int, dict[str, int]]:
        """Take the sessions' views; return (open channels, live associations by sctp state)."""
        open_channels = 0
        assocs = {"connecting": 0, "connected": 0}
        seen: dict[str, dict[str, int]] = {}
        for view in views:
            dc = view.get("datachannels")
            sid = view.get("id")
            if not isinstance(dc, Mapping) or not isinstance(sid, str):
                continue
            before = self._seen.get(sid, {})
            now = seen[sid] = {}
            for key in _DC_COUNTERS:
                n = now[key] = max(_count(dc.get(key)), before.get(key, 0))
                self.totals[key] += n - before.get(key, 0)
            if view.get("state") == "ended":
                continue
            chans = dc.get("open")
            open_channels += len(chans) if isinstance(chans, list) else 0
            sctp = dc.get("sctp")
            # "connecting", "connected", or the reason it closed (RFC 9260 §9): one bucket.
            key = sctp if sctp in assocs else "closed"
            assocs[key] = assocs.get(key, 0) + 1
        self._seen = seen
        return open_channels, assocs


_channel_totals: weakref.WeakKeyDictionary[SignalingState, ChannelTotals] = weakref.WeakKeyDictionary()


def _render_channels(fams: _Families, state: SignalingState) -> None:
    totals = _channel_totals.setdefault(state, ChannelTotals())
    open_channels, assocs = totals.update(rec.view() for rec in state.registry.sessions.values())
    fams.add("appliance_datachannels_open", "gauge",
             "Data channels open in live sessions.", {}, open_channels)
    for sctp, n in assocs.items():
        fams.add("appliance_datachannel_associations", "gauge",
                 "Live sessions with data channels, by SCTP association state.", {"sctp": sctp}, n)
    for key, (family, labels) in _DC_COUNTERS.items():
        fams.add(family, "counter", _DC_HELP[family], labels, totals.totals[key])


#: ``stats`` → ``load`` keys shown per transceiver: (family, help, scale).
_LOAD_GAUGES = {
    "busy": ("appliance_transceiver_busy_ratio",
             "Smoothed share of what its core has left that the transceiver uses "
             "(admission's signal).", 1.0),
    "own": ("appliance_transceiver_own_cpu_ratio",
            "Smoothed share of a core the transceiver process itself uses.", 1.0),
    "core_available": ("appliance_transceiver_available_cores",
                       "Cores the transceiver could have used over the last window "
                       "(own use + idle, at least a fair share, minus steal).", 1.0),
    "late_p90_ms": ("appliance_transceiver_frame_late_p90_seconds",
                    "90th percentile of the transceiver's tick/paced-frame lateness "
                    "(windows that sent media).", 1e-3),
    "backlog_max_ms": ("appliance_transceiver_receive_backlog_max_seconds",
                       "Longest the transceiver's receive loop was seen behind its socket "
                       "in the last window (0: it kept draining it).", 1e-3),
    "cpu": ("appliance_transceiver_cpu_ratio",
            "Share of its core the transceiver used over the last window.", 1.0),
    "lag_max_ms": ("appliance_transceiver_loop_lag_max_seconds",
                   "Worst lateness of the transceiver's 20 ms tick in the last window.", 1e-3),
    "opus_complexity": ("appliance_transceiver_opus_complexity",
                        "Opus encoder complexity the transceiver's calls encode at now.", 1.0),
}


def _render_load(fams: _Families, state: SignalingState) -> None:
    for ep in state.transceivers.values():
        labels = {"transceiver": ep.key}
        load = ep.stats.get("load")
        if isinstance(load, Mapping):
            for key, (family, help_text, scale) in _LOAD_GAUGES.items():
                value = load.get(key)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    fams.add(family, "gauge", help_text, labels, value * scale)
        if not ep.up:
            continue
        adm = state.admission.view(int(ep.key))
        fams.add("appliance_transceiver_headroom_ratio", "gauge",
                 "Share of the core left below the admission limit, placed calls counted.",
                 labels, adm["headroom"])
        fams.add("appliance_transceiver_room_calls", "gauge",
                 "Calls signaling would still place on the transceiver.", labels, adm["room"])
        fams.add("appliance_transceiver_call_cost_ratio", "gauge",
                 "Share of a core one call costs, learned from the transceiver's reports.",
                 labels, adm["call_cost"])
        fams.add("appliance_transceiver_neighbour_cost_ratio", "gauge",
                 "Share of a core one call costs the appliance's other processes on the "
                 "transceiver's CPUs (relay, signaling), learned.", labels,
                 adm["neighbour_cost"])
    fams.add("appliance_admission_refused_total", "counter",
             "POST /v1/sessions refused 503 overloaded: no transceiver had headroom.", {},
             state.admission.refused)


def _render_sip(fams: _Families, calls: SipCalls) -> None:
    total = "counter"
    for event, n in sorted(calls.counters.items()):
        fams.add("appliance_sip_calls_total", total, "Phone call control events, by kind.",
                 {"direction": "inbound", "event": event}, n)
    ob = calls.outbound
    if ob is not None:
        for event, n in sorted(ob.counters.items()):
            fams.add("appliance_sip_calls_total", total, "Phone call control events, by kind.",
                     {"direction": "outbound", "event": event}, n)
    fams.add("appliance_sip_calls", "gauge", "Phone calls in progress.",
             {"direction": "inbound"}, len(calls.calls))
    fams.add("appliance_sip_calls", "gauge", "Phone calls in progress.",
             {"direction": "outbound"}, len(ob.calls) if ob is not None else 0)
    shell = calls.running
    if not isinstance(shell, SipService):
        return
    ep = shell.endpoint
    for event, n in sorted(ep.counters.items()):
        fams.add("appliance_sip_endpoint_total", total,
                 "SIP messages the core refused, dropped or could not answer, by reason.",
                 {"event": event}, n)
    for event, n in sorted(shell.counters.items()):
        fams.add("appliance_sip_shell_total", total,
                 "SIP socket and connection events (send queue full, closes, dials).",
                 {"event": event}, n)
    stats = ep.stats()
    for kind in ("server", "client"):
        fams.add("appliance_sip_transactions", "gauge", "SIP transactions held, by side.",
                 {"kind": kind}, stats[f"{kind}_transactions"])
    fams.add("appliance_sip_pending_invites", "gauge",
             "Incoming INVITEs not yet answered (capped by --sip-max-invites).", {},
             stats["pending_invites"])
    fams.add("appliance_sip_connections", "gauge", "SIP TCP/TLS connections open.", {},
             shell.connections)


def _histogram(fams: _Families, name: str, help_text: str, labels: Mapping[str, str],
               h: Histogram) -> None:
    """One histogram's series (cumulative buckets, ``+Inf``, sum, count) under ``labels``."""
    cum = 0
    for bound, n in zip(h.bounds, h.counts, strict=True):
        cum += n
        fams.add_raw(name, "histogram", help_text,
                     f"{name}_bucket{_labels({**labels, 'le': _num(bound)})} {cum}")
    fams.add_raw(name, "histogram", help_text,
                 f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {h.count}")
    fams.add_raw(name, "histogram", help_text, f"{name}_sum{_labels(labels)} {_num(h.sum)}")
    fams.add_raw(name, "histogram", help_text, f"{name}_count{_labels(labels)} {h.count}")


#: HELP of the ``appliance_turn_<name>_seconds`` families (registry.py ``TURN_SPANS``).
_TURN_HELP = {
    "speech": "Per turn: the caller's speech, from the detector hearing it start to the "
              "VAD's pause.",
    "end_of_turn": "Per turn: from the caller's end of speech (the VAD's pause) to the end "
                   "of turn being decided.",
    "transcript": "Per turn: from the caller's end of speech to the final transcript.",
    "first_token": "Per turn: from the caller's end of speech to the LLM's first token.",
    "first_audio": "Per turn: from the caller's end of speech to the TTS's first frame.",
    "first_sent": "Per turn: from the caller's end of speech to the reply's first frame "
                  "sent (the pause the caller hears).",
}


def render(state: SignalingState, sip: SipCalls | None = None) -> str:
    fams = _Families()

    by_state: dict[str, float] = {s: 0 for s in ("new", "connecting", "connected", "ended")}
    for ep in state.transceivers.values():
        sbs = ep.stats.get("sessions_by_state")
        if isinstance(sbs, Mapping):
            for st, n in sbs.items():
                if isinstance(n, int | float) and not isinstance(n, bool):
                    by_state[str(st)] = by_state.get(str(st), 0) + n
    for st, n in by_state.items():
        fams.add("appliance_sessions", "gauge", "Sessions held by the transceivers, by state.",
                 {"state": st}, n)
    fams.add("appliance_sessions_lost_total", "counter",
             "Sessions ended because their transceiver died.", {}, state.registry.sessions_lost)
    fams.add("appliance_sessions_created_total", "counter",
             "Sessions created through this signaling process.", {},
             state.placement.created_total())

    _render_channels(fams, state)

    help_h = "Time from offer received to each setup step, per session."
    for step, h in state.registry.setup_hist.items():
        _histogram(fams, "appliance_session_setup_seconds", help_h, {"step": step}, h)
    for name, h in state.registry.turn_hist.items():
        _histogram(fams, f"appliance_turn_{name}_seconds", _TURN_HELP[name], {}, h)

    for ep in state.transceivers.values():
        counters = ep.stats.get("counters")
        if isinstance(counters, Mapping):
            for name, value in flatten(counters):
                fams.add(f"appliance_transceiver_{name}_total", "counter",
                         f"Transceiver counter {name}.", {"transceiver": ep.key}, value)
    _render_load(fams, state)
    for ep in state.relays.values():
        counters = ep.stats.get("counters")
        if isinstance(counters, Mapping):
            for name, value in flatten(counters):
                fams.add(f"appliance_relay_{name}_total", "counter",
                         f"Relay worker counter {name}.", {"worker": ep.key}, value)
        flows = ep.stats.get("flows")
        if isinstance(flows, int | float) and not isinstance(flows, bool):
            fams.add("appliance_relay_flows", "gauge", "Flows in a relay worker's table.",
                     {"worker": ep.key}, flows)

    for region, n in sorted(state.ingress_picks.items()):
        fams.add("appliance_ingress_answers_total", "counter",
                 "Answers by the geo-steered ingress region advertised (\"\" = default).",
                 {"region": region}, n)

    for code, n in sorted(state.http_responses.items()):
        fams.add("appliance_http_responses_total", "counter", "HTTP responses by status code.",
                 {"code": str(code)}, n)

    for ep in state.endpoints():
        labels = {"role": ep.role, "id": ep.key}
        fams.add("appliance_process_up", "gauge",
                 "1 when the process is believed up and answered its last poll.", labels,
                 1 if ep.up and ep.failures == 0 else 0)
        restarts = ep.process.get("restarts")
        if isinstance(restarts, int):
            fams.add("appliance_process_restarts_total", "counter",
                     "Times the supervisor restarted the process.", labels, restarts)
    if sip is not None:
        _render_sip(fams, sip)
    return fams.render()
