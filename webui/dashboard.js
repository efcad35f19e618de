// The sessions dashboard (/): a live table fed by GET /v1/events, a detail panel with the
// setup timeline, each turn's waterfall (voice agents) and RTT/jitter/loss sparklines,
// per-process relay/transceiver health, and an End button per session (DELETE
// /v1/sessions/{id}).
import {
  AuthError, adoptTokenFromUrl, api, fmtBitrate, fmtDuration, fmtLoss, fmtMs, fmtNum, fmtTime,
  followEvents, h, httpError, renderSparkline, renderTimeline, renderTurns, shortId, useApiTokenDirectly,
  wireAuthForm, dash,
} from "./common.js";

const HISTORY = 60; // samples kept per session (one a second: the last minute)

const $ = (id) => document.getElementById(id);
const rowsEl = $("session-rows");

/** id → { data, history: [{t, bytes_in, bytes_out, rtt, jitter, loss}], row, cells, gone } */
const sessions = new Map();
/** process name → { t, packets } for packets-per-second */
const procPrev = new Map();
let selected = null;
let gotSnapshot = false;
let stopEvents = null;

// Columns: [key, header label (for the narrow card layout), class, render(session, entry)].
const COLUMNS = [
  ["id", "Session", "", null],
  ["state", "State", "", null],
  ["transceiver", "Transceiver", "num", (s) => s.transceiver ?? dash],
  // A phone call (kind "phone": SIP, either direction) says so before its trunk's address.
  ["client", "Client", "mono", (s) => (s.kind === "phone" ? `phone ${s.client_address || ""}`.trim() : s.client_address || dash)],
  ["agent", "Agent", "agent", (s) => s.agent || dash],
  ["codec", "Codec", "", (s) => s.codec || dash],
  ["duration", "Duration", "num", (s) => fmtDuration(duration(s))],
  ["pin", "Packets in", "num", (s) => fmtNum(s.packets_in)],
  ["pout", "Packets out", "num", (s) => fmtNum(s.packets_out)],
  ["bin", "Bitrate in", "num", (s, e) => (s.state === "ended" ? dash : fmtBitrate(bitrate(e, "bytes_in")))],
  ["bout", "Bitrate out", "num", (s, e) => (s.state === "ended" ? dash : fmtBitrate(bitrate(e, "bytes_out")))],
  ["rtt", "RTT", "num", (s) => fmtMs(s.rtt_ms)],
  ["jitter", "Jitter", "num", (s) => fmtMs(s.jitter_ms)],
  ["loss", "Loss", "num", (s) => fmtLoss(s.loss)],
  ["actions", "Actions", "", null],
];

function duration(s) {
  if (typeof s.created_at !== "number") return NaN;
  const end = typeof s.ended_at === "number" ? s.ended_at : Date.now() / 1000;
  return Math.max(end - s.created_at, 0);
}

/** Bits per second over the last ~3 s of snapshots (the API gives byte counters, not rates). */
function bitrate(entry, key) {
  const hist = entry.history;
  if (hist.length < 2) return NaN;
  const last = hist[hist.length - 1];
  let first = hist[hist.length - 2];
  for (let i = hist.length - 2; i >= 0 && last.t - hist[i].t <= 3; i--) first = hist[i];
  const dt = last.t - first.t;
  if (!(dt > 0) || typeof last[key] !== "number" || typeof first[key] !== "number") return NaN;
  return Math.max(last[key] - first[key], 0) * 8 / dt;
}

// ---------------------------------------------------------------------------- table

function makeRow(id) {
  const cells = {};
  const row = h("tr", { "data-session-id": id });
  for (const [key, label, cls] of COLUMNS) {
    const td = h("td", { "data-label": label, class: cls || null });
    cells[key] = td;
    row.append(td);
  }
  cells.id.append(h("button", {
    type: "button", class: "link mono", "aria-label": `Details of session ${id}`,
    "aria-controls": "detail", title: id, text: shortId(id),
    onclick: () => select(id, true),
  }));
  cells.state.append(h("span", { class: "state" }));
  cells.actions.append(h("button", {
    type: "button", class: "danger", "aria-label": `End session ${id}`, text: "End",
    onclick: (ev) => endSession(id, ev.currentTarget),
  }));
  return { row, cells };
}

function updateRow(entry) {
  const s = entry.data;
  const { cells, row } = entry;
  const stateEl = cells.state.firstChild;
  const state = s.state || "unknown";
  stateEl.dataset.state = state;
  stateEl.textContent = state;
  stateEl.title = s.end_reason ? `ended: ${s.end_reason}` : "";
  row.classList.toggle("ended", state === "ended");
  row.classList.toggle("selected", selected === s.id);
  for (const [key, , , render] of COLUMNS) {
    if (!render) continue;
    const text = String(render(s, entry));
    if (cells[key].textContent !== text) { cells[key].textContent = text; if (key === "agent") cells[key].title = text; }
  }
  const end = cells.actions.firstChild;
  if (state === "ended") { end.disabled = true; end.textContent = "Ended"; }
}

function renderTable() {
  const list = [...sessions.values()].filter((e) => !e.gone);
  // Live sessions first, newest first within each group.
  list.sort((a, b) => ((a.data.state === "ended") - (b.data.state === "ended"))
    || ((b.data.created_at || 0) - (a.data.created_at || 0)));
  const active = list.filter((e) => e.data.state !== "ended").length;
  $("session-count").textContent = gotSnapshot ? `(${active} active, ${list.length} listed)` : "";
  if (!list.length) {
    rowsEl.replaceChildren(h("tr", {}, h("td", { colspan: COLUMNS.length, class: "empty", id: "empty-cell" },
      gotSnapshot ? "No sessions right now. Open the " : "Waiting for the first update…",
      gotSnapshot ? h("a", { href: "demo", text: "demo" }) : null,
      gotSnapshot ? " to start one." : null)));
    return;
  }
  // Re-append in order; appending an existing node moves it, keeping focus and listeners.
  const current = [...rowsEl.children];
  if (current.length !== list.length || current.some((r, i) => r !== list[i].row)) {
    rowsEl.replaceChildren(...list.map((e) => e.row));
  }
}

// ---------------------------------------------------------------------------- snapshot

function onSnapshot(snap) {
  hideBanner();
  const t = performance.now() / 1000;
  if (snap.processes !== undefined) renderProcesses(snap.processes, t);
  if (!Array.isArray(snap.sessions)) return; // a health-only event
  gotSnapshot = true;
  const seen = new Set();
  for (const s of snap.sessions || []) {
    if (!s || typeof s.id !== "string") continue;
    seen.add(s.id);
    let entry = sessions.get(s.id);
    if (!entry) {
      entry = { history: [], ...makeRow(s.id) };
      sessions.set(s.id, entry);
    }
    entry.data = s;
    entry.gone = false;
    entry.history.push({ t, bytes_in: s.bytes_in, bytes_out: s.bytes_out, rtt: s.rtt_ms, jitter: s.jitter_ms, loss: s.loss });
    if (entry.history.length > HISTORY) entry.history.shift();
    updateRow(entry);
  }
  for (const [id, entry] of sessions) {
    if (seen.has(id)) continue;
    // Keep the selected one around so its details stay readable; forget the rest.
    if (id === selected) entry.gone = true; else sessions.delete(id);
  }
  renderTable();
  if (selected) renderDetail();
}

// ---------------------------------------------------------------------------- detail

function select(id, focus) {
  selected = id;
  if (id) history.replaceState(null, "", `#session=${encodeURIComponent(id)}`);
  else history.replaceState(null, "", location.pathname + location.search);
  for (const e of sessions.values()) e.row.classList.toggle("selected", e.data && e.data.id === id);
  renderDetail();
  if (focus && id) $("detail").focus();
}

function renderDetail() {
  const panel = $("detail");
  const entry = selected && sessions.get(selected);
  if (!entry) {
    // Selected from the URL but not (yet) listed: say so rather than show nothing.
    panel.hidden = !selected;
    if (selected) {
      $("detail-h").textContent = `Session ${selected}`;
      $("detail-gone").hidden = !gotSnapshot;
      $("detail-fields").replaceChildren();
      $("detail-timeline").replaceChildren();
      renderTurns($("detail-turns"), null);
      $("detail-end").disabled = true;
    }
    return;
  }
  const s = entry.data;
  panel.hidden = false;
  $("detail-h").textContent = `Session ${s.id}`;
  $("detail-gone").hidden = !entry.gone;
  const endBtn = $("detail-end");
  if (endBtn.textContent !== "Ending…") {
    endBtn.disabled = s.state === "ended" || entry.gone;
    endBtn.textContent = s.state === "ended" ? "Ended" : "End session";
  }
  const flow = s.relay_flow || {};
  const fields = [
    ["State", `${s.state || dash}${s.end_reason ? ` (${s.end_reason})` : ""}`],
    ["Kind", s.kind === "phone" ? "phone call (SIP)" : "WebRTC"],
    ["Transceiver", s.transceiver ?? dash],
    ["Agent", s.agent || dash],
    ["Client address", s.client_address || dash],
    ["Relay flow", flow.public || flow.relay ? `${flow.public || "?"} via ${flow.relay || "?"}` : dash],
    ["Codec", s.codec || dash],
    ["SRTP profile", s.srtp_profile || dash],
    ["DTLS cipher suite", s.cipher_suite || dash],
    ["Started", fmtTime(s.created_at)],
    ["Ended", fmtTime(s.ended_at)],
    ["Duration", fmtDuration(duration(s))],
    ["Packets in / out", `${fmtNum(s.packets_in)} / ${fmtNum(s.packets_out)}`],
    ["Bytes in / out", `${fmtNum(s.bytes_in)} / ${fmtNum(s.bytes_out)}`],
    ...channelFields(s.datachannels),
    ...mediaFields(s.media),
  ];
  $("detail-fields").replaceChildren(...fields.flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: String(v) })]));
  renderTimeline($("detail-timeline"), s.timeline);
  renderTurns($("detail-turns"), s.turns); // each turn's waterfall, when its agent reports them
  renderTranscript($("detail-transcript"), s.transcript);
  renderSparkline($("spark-rtt"), "RTT", entry.history.map((x) => x.rtt), (v) => fmtMs(v));
  renderSparkline($("spark-jitter"), "Jitter", entry.history.map((x) => x.jitter), (v) => fmtMs(v));
  renderSparkline($("spark-loss"), "Loss", entry.history.map((x) => x.loss), fmtLoss);
}

// What the agent heard and said (the session's `transcript`: the assistant's lines).
function renderTranscript(box, lines) {
  box.hidden = !lines || !lines.length;
  box.replaceChildren(...(lines || []).map((t) => h("li", {
    class: `msg line-${t.who === "user" ? "user" : "agent"}`,
    text: `${t.who === "user" ? "caller" : "agent"}: ${t.text}`,
  })));
}

// A session's data channels (its `datachannels` object; null when the offer had none).
function channelFields(dc) {
  if (!dc) return [["Data channels", "none offered"]];
  const open = Array.isArray(dc.open) ? dc.open : [];
  const names = open.map((c) => `${c.label || "(no label)"} #${c.id}${c.ordered === false ? " unordered" : ""}`);
  return [
    ["Data channels", `SCTP ${dc.sctp || dash} · ${open.length} open${names.length ? `: ${names.join(", ")}` : ""}`],
    ["Messages in / out", `${fmtNum(dc.messages_in)} / ${fmtNum(dc.messages_out)}${dc.messages_dropped ? ` (${fmtNum(dc.messages_dropped)} dropped)` : ""}`],
    ["Message bytes in / out", `${fmtNum(dc.bytes_in)} / ${fmtNum(dc.bytes_out)}`],
  ];
}

// A session's PCM stages and levels (its `media` object; null for passthrough / data only).
function mediaFields(m) {
  if (!m) return [];
  const lv = m.levels || {};
  const level = (d) => (d ? `${d.rms_dbfs} dBFS RMS, peak ${d.peak_dbfs}${d.clipped ? ` (${fmtNum(d.clipped)} clipped)` : ""}` : dash);
  const rows = [
    ["Level in / out", `${level(lv.in)} / ${level(lv.out)}`],
    ["Stages in / out", `${(m.in || []).join(" → ") || "none"} / ${(m.out || []).join(" → ") || "none"}`],
  ];
  if (m.stage_failures) rows.push(["Stage failures", `${m.stage_failures}: ${Object.keys(m.failed || {}).join(", ")}`]);
  const off = Object.entries(m.unavailable || {});
  if (off.length) rows.push(["Unavailable", off.map(([k, v]) => `${k} (${v})`).join("; ")]);
  return rows;
}

// ---------------------------------------------------------------------------- end

async function endSession(id, button) {
  const label = button.textContent;
  button.disabled = true;
  button.textContent = "Ending…";
  try {
    const resp = await api(`v1/sessions/${encodeURIComponent(id)}`, { method: "DELETE" });
    // 404 means it is already gone, which is what was asked for.
    if (!resp.ok && resp.status !== 404) throw await httpError(resp, `Could not end session ${id}`);
    button.textContent = "Ended";
    const entry = sessions.get(id);
    if (entry) { entry.data = { ...entry.data, state: "ended" }; updateRow(entry); if (id === selected) renderDetail(); }
  } catch (e) {
    button.disabled = false;
    button.textContent = label;
    showError(e, `Could not end session ${id}`);
  }
}

// ---------------------------------------------------------------------------- processes

/**
 * Accepts [{role, id, ...}] (what signaling's health view lists), {name: {...}} or
 * {group: [{...}]}: the snapshot's shape is the server's to choose.
 */
function flattenProcesses(procs) {
  const out = [];
  const nameOf = (p, fallback) => {
    if (p.name) return String(p.name);
    const id = p.id ?? p.worker ?? p.transceiver;
    if (p.role && id !== undefined) return String(id).startsWith(p.role) ? String(id) : `${p.role}-${id}`;
    return id !== undefined && typeof fallback !== "string" ? String(id) : String(fallback);
  };
  const add = (p, fallback) => { if (p && typeof p === "object") out.push([nameOf(p, fallback), p]); };
  if (Array.isArray(procs)) procs.forEach((p, i) => add(p, i));
  else if (procs && typeof procs === "object") {
    for (const [k, v] of Object.entries(procs)) {
      if (Array.isArray(v)) v.forEach((p, i) => add(p, `${k}-${i}`));
      else add(v, k);
    }
  }
  return out;
}

function numericLeaves(obj, prefix = "", out = {}) {
  for (const [k, v] of Object.entries(obj || {})) {
    if (typeof v === "number") out[prefix + k] = v;
    else if (v && typeof v === "object" && !Array.isArray(v)) numericLeaves(v, `${prefix}${k}.`, out);
  }
  return out;
}

function roleOf(name, p) {
  if (p.role) return String(p.role);
  const n = name.toLowerCase();
  if (n.includes("relay") || "worker" in p) return "relay";
  if (n.includes("transceiver") || "sessions_by_state" in p || "transceiver" in p) return "transceiver";
  return "";
}

function renderProcesses(procs, t) {
  const box = $("procs");
  const list = flattenProcesses(procs);
  if (!list.length) {
    box.replaceChildren(h("p", { class: "hint", text: "No relay or transceiver processes reported." }));
    return;
  }
  const cards = list.map(([name, p]) => {
    const counters = numericLeaves(p.counters && typeof p.counters === "object" ? p.counters : p);
    const packets = Object.entries(counters)
      .filter(([k]) => /(packets|datagrams)/i.test(k) && /in/i.test(k) && !/drop/i.test(k))
      .reduce((a, [, v]) => a + v, 0);
    const prev = procPrev.get(name);
    procPrev.set(name, { t, packets });
    const pps = prev && t > prev.t ? Math.max(packets - prev.packets, 0) / (t - prev.t) : NaN;
    const flows = typeof p.flows === "number" ? p.flows : counters.flows;
    const drops = Object.entries(counters).filter(([k]) => /drop/i.test(k));
    const up = typeof p.up === "boolean" ? p.up : typeof p.alive === "boolean" ? p.alive : null;
    const status = p.state || p.status
      || (up === false ? "down" : up === true ? (p.answering === false ? "up, not answering" : "up") : null);
    const fields = [];
    if (status) fields.push(["Status", String(status)]);
    if (typeof p.pid === "number") fields.push(["PID", String(p.pid)]);
    if (typeof p.restarts === "number") fields.push(["Restarts", String(p.restarts)]);
    if (typeof p.uptime_s === "number") fields.push(["Uptime", fmtDuration(p.uptime_s)]);
    if (p.error) fields.push(["Last error", String(p.error)]);
    if (typeof flows === "number") fields.push(["Flows", fmtNum(flows)]);
    fields.push(["Packets/s in", Number.isFinite(pps) ? pps.toFixed(0) : dash]);
    if (p.sessions_by_state && typeof p.sessions_by_state === "object") {
      const sbs = Object.entries(p.sessions_by_state).map(([k, v]) => `${k} ${v}`).join(", ");
      fields.push(["Sessions", sbs || "none"]);
    }
    // Headroom (issues 23, 32): the transceiver's load — its share of what the core has
    // left, which admission decides on — and signaling's admission view.
    const load = p.load && typeof p.load === "object" ? p.load : null;
    if (load && typeof load.busy === "number") {
      const lag = typeof load.lag_max_ms === "number" ? `, loop lag ≤ ${load.lag_max_ms.toFixed(1)} ms` : "";
      const avail = typeof load.available === "number" ? load.available : 1;
      const of = avail >= 0.995 ? "of a core" : `of the ${avail.toFixed(2)} core left`;
      fields.push(["Load", `${(100 * load.busy).toFixed(0)} % ${of}${lag}`]);
      if (typeof load.own === "number" && avail < 0.995) {
        const steal = typeof load.core_steal === "number" && load.core_steal > 0.005
          ? `, ${(100 * load.core_steal).toFixed(0)} % stolen` : "";
        fields.push(["Own CPU", `${(100 * load.own).toFixed(0)} % of a core (the rest taken by other processes${steal})`]);
      }
      if (typeof load.late_p90_ms === "number") fields.push(["Frames late (p90)", `${load.late_p90_ms.toFixed(1)} ms`]);
    }
    if (load && typeof load.opus_complexity === "number") fields.push(["Opus complexity", String(load.opus_complexity)]);
    const adm = p.admission && typeof p.admission === "object" ? p.admission : null;
    if (adm && typeof adm.headroom === "number") {
      const room = typeof adm.room === "number" ? ` (${adm.room} more call${adm.room === 1 ? "" : "s"})` : "";
      const degraded = adm.degraded === true ? ", calls degraded: admitting up to " +
        `${(100 * (typeof adm.limit === "number" ? adm.limit : 0)).toFixed(0)} %` : "";
      fields.push(["Headroom", (adm.room === 0 ? "full: new calls refused" : `${(100 * adm.headroom).toFixed(0)} %${room}`) + degraded]);
    }
    const totalDrops = drops.reduce((a, [, v]) => a + v, 0);
    const role = roleOf(name, p);
    return h("article", { class: "proc", "data-process": name, "data-up": up === null ? null : String(up), "aria-label": `${role || "process"} ${name}` },
      h("h3", {}, h("span", { text: name }), h("span", { class: "role", text: role })),
      h("dl", { class: "kv" }, fields.flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: v })])),
      h("div", { class: "hint", text: drops.length ? `Drops: ${fmtNum(totalDrops)}` : "Drops: none counted" }),
      drops.length ? h("ul", { class: "drops", "aria-label": `Drops by reason, ${name}` },
        drops.map(([k, v]) => h("li", { class: v ? "nonzero" : null },
          h("span", { text: k.replace(/^(drops?|dropped)[._]?/i, "") || k }), h("b", { text: fmtNum(v) })))) : null,
      h("details", {}, h("summary", { text: "All counters" }),
        h("dl", { class: "kv" }, Object.entries(counters).flatMap(([k, v]) => [h("dt", { class: "mono", text: k }), h("dd", { text: fmtNum(v) })]))),
    );
  });
  // Keep any open "All counters" disclosure open across updates.
  const open = new Set([...box.querySelectorAll("article.proc")].filter((a) => a.querySelector("details[open]")).map((a) => a.dataset.process));
  for (const c of cards) if (open.has(c.dataset.process)) c.querySelector("details").open = true;
  box.replaceChildren(...cards);
}

// ---------------------------------------------------------------------------- status

const STATUS_TEXT = {
  connecting: "Connecting…",
  live: "Live",
  reconnecting: "Reconnecting…",
  polling: "Live (polling)",
  offline: "Server unreachable",
  auth: "Token needed",
};

function onStatus(status, error) {
  const live = $("live");
  live.dataset.status = status;
  $("live-text").textContent = STATUS_TEXT[status] || status;
  if (status === "offline") {
    showError(error, "Live updates stopped", "The dashboard keeps retrying; the table shows the last values it received.");
  } else if (status === "auth") {
    showError(error instanceof AuthError ? error : new AuthError(), "Access token required");
  }
}

function showError(e, title, extra) {
  $("banner").hidden = false;
  $("banner-title").textContent = title;
  $("banner-text").textContent = `${e && e.message ? e.message : String(e || "")}${extra ? ` ${extra}` : ""}`;
  $("auth-form").hidden = !(e instanceof AuthError);
}

function hideBanner() {
  if ($("auth-form").hidden) $("banner").hidden = true;
}

// ---------------------------------------------------------------------------- start

function start() {
  if (stopEvents) stopEvents();
  stopEvents = followEvents(onSnapshot, onStatus);
}

useApiTokenDirectly();
adoptTokenFromUrl();
wireAuthForm($("auth-form"), () => { $("auth-form").hidden = true; $("banner").hidden = true; start(); });
$("detail-close").addEventListener("click", () => {
  const id = selected;
  select(null);
  const entry = id && sessions.get(id);
  if (entry) entry.cells.id.firstChild.focus();
});
$("detail-end").addEventListener("click", (ev) => selected && endSession(selected, ev.currentTarget));
document.addEventListener("keydown", (ev) => { if (ev.key === "Escape" && selected) $("detail-close").click(); });
const fromHash = /session=([^&]+)/.exec(location.hash);
if (fromHash) select(decodeURIComponent(fromHash[1]));
start();

// For tests and for poking at from the console.
window.applianceDashboard = {
  get sessions() { return [...sessions.values()].filter((e) => !e.gone).map((e) => e.data); },
  get status() { return $("live").dataset.status; },
  select,
};
