// Shared by the dashboard and the demo: API calls (with the client-token flow of
// DESIGN.md "Auth"), the server-sent event stream, formatting, and two small charts
// (the setup timeline bar and sparklines). Standard browser APIs only; no dependencies.
//
// All URLs are relative ("v1/sessions"), so the pages work whether the signaling app is
// reached at the root or behind a reverse proxy under a path prefix.

// ---------------------------------------------------------------------------- errors

/** The server could not be reached at all (fetch rejected: refused, DNS, offline). */
export class UnreachableError extends Error {
  constructor(url, cause) {
    super(`Cannot reach the appliance at ${new URL(url).origin}. Is \`appliance up\` running, and is this the address it printed?`);
    this.name = "UnreachableError";
    this.cause = cause;
  }
}

/** The API wants a token and none we could get was accepted. */
export class AuthError extends Error {
  constructor(message) {
    super(message || "This appliance requires an access token. Paste the token printed by `appliance up` (or configured for it) below.");
    this.name = "AuthError";
  }
}

/** Any other non-2xx answer; carries the RFC 9457 problem body when the server sent one. */
export class HttpError extends Error {
  constructor(status, problem, fallback) {
    const code = problem && (problem.code || problem.title);
    const detail = problem && (problem.detail || problem.title);
    super(`${fallback} (HTTP ${status}${code ? ` ${code}` : ""})${detail ? `: ${detail}` : "."}`);
    this.name = "HttpError";
    this.status = status;
    this.problem = problem;
  }
}

export async function httpError(resp, fallback) {
  let problem = null;
  try {
    const text = await resp.text();
    try { problem = JSON.parse(text); } catch { problem = text ? { detail: text.slice(0, 300) } : null; }
  } catch { /* body unreadable: the status alone must do */ }
  return new HttpError(resp.status, problem, fallback || "The server answered with an error");
}

// ---------------------------------------------------------------------------- auth

// The long-lived API token a person pasted (or passed as #token=… in the URL), kept for this
// tab only. It is used for one thing: minting short-lived client tokens.
const API_KEY = "appliance.apiToken";
let clientToken = null; // { value, expiresMs, agent }
// The agent client tokens are minted for (POST /v1/client_tokens {"agent"}): a client token
// may create sessions only with the agent it was minted for. null: the deployment's.
let tokenAgent = null;
let authNeeded = false;
// "client": mint short-lived client tokens (the demo: they may create and end their own
// sessions). "api": send the API token itself (the dashboard lists, watches and ends every
// session, which client tokens are not scoped for).
let tokenKind = "client";

/** The agent the page's next sessions ask for; a client token for another is re-minted. */
export function setTokenAgent(agent) {
  tokenAgent = agent || null;
}

export function useApiTokenDirectly() {
  tokenKind = "api";
}

export function apiUrl(path) {
  return new URL(path, document.baseURI).toString();
}

function toMs(expiresAt) {
  if (typeof expiresAt !== "number") return Date.now() + 60_000;
  // Unix seconds (what the API returns) or milliseconds: both are accepted.
  return expiresAt < 1e12 ? expiresAt * 1000 : expiresAt;
}

/** Take a token from the URL fragment (#token=…) once, then remove it from the address bar. */
export function adoptTokenFromUrl() {
  const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (!m) return;
  setApiToken(decodeURIComponent(m[1]));
  history.replaceState(null, "", location.pathname + location.search);
}

export function setApiToken(value) {
  if (value) sessionStorage.setItem(API_KEY, value); else sessionStorage.removeItem(API_KEY);
  clientToken = null;
}

async function mintClientToken() {
  const url = apiUrl("v1/client_tokens");
  const headers = { "Content-Type": "application/json" };
  const apiKey = sessionStorage.getItem(API_KEY);
  if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
  let resp;
  try {
    resp = await fetch(url, { method: "POST", headers, body: JSON.stringify(tokenAgent ? { agent: tokenAgent } : {}) });
  } catch (e) {
    throw new UnreachableError(url, e);
  }
  if (resp.status === 401 || resp.status === 403) {
    throw new AuthError(apiKey
      ? "The access token was not accepted (HTTP " + resp.status + "). Check it and try again."
      : undefined);
  }
  if (!resp.ok) throw await httpError(resp, "Could not get a client token");
  const body = await resp.json();
  if (!body || typeof body.token !== "string") throw new AuthError("The server sent no client token.");
  clientToken = { value: body.token, expiresMs: toMs(body.expires_at), agent: tokenAgent };
  return clientToken.value;
}

async function currentToken(force) {
  if (!authNeeded && !force) return null;
  if (tokenKind === "api") {
    const apiKey = sessionStorage.getItem(API_KEY);
    if (!apiKey) throw new AuthError();
    return apiKey;
  }
  if (!force && clientToken && clientToken.agent === tokenAgent
      && clientToken.expiresMs - Date.now() > 15_000) return clientToken.value;
  return mintClientToken();
}

/**
 * fetch() a path of the API. On loopback no token is needed; the first 401 switches this
 * page into token mode (client token from POST /v1/client_tokens, retried once).
 * Throws UnreachableError / AuthError; other statuses are returned for the caller to judge.
 */
export async function api(path, init = {}) {
  const url = apiUrl(path);
  const attempt = async (token) => {
    const headers = new Headers(init.headers || {});
    if (token) headers.set("Authorization", `Bearer ${token}`);
    try {
      return await fetch(url, { ...init, headers });
    } catch (e) {
      if (e && e.name === "AbortError") throw e;
      throw new UnreachableError(url, e);
    }
  };
  const first = await currentToken(false);
  let resp = await attempt(first);
  if (resp.status === 401) {
    // No token yet: this is how we learn the API wants one. Get one and try once more.
    // A token that was refused is not retried in a loop (no minting storm on polls).
    authNeeded = true;
    if (!first) resp = await attempt(await currentToken(false));
    if (resp.status === 401) {
      throw new AuthError(tokenKind === "api"
        ? "The access token was not accepted (HTTP 401). Check it and try again."
        : "The server refused the client token (HTTP 401).");
    }
  }
  return resp;
}

/**
 * Wire an auth form (a password input + submit) so a person can paste the API token.
 * `onToken` runs after a token is stored.
 */
export function wireAuthForm(form, onToken) {
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = form.querySelector("input");
    setApiToken(input.value.trim());
    input.value = "";
    onToken();
  });
}

// ---------------------------------------------------------------------------- events

/**
 * Follow GET /v1/events (server-sent events) and call onSnapshot(data) for every `sessions`
 * or `health` event (data holds `sessions` and/or `processes`). Read with fetch() rather than EventSource so the stream can carry a bearer token and
 * so a 401/404 is seen as such. Reconnects with backoff; if the server has no event stream
 * (404/405) it falls back to polling GET /v1/sessions once a second.
 * onStatus(status, error) gets "connecting" | "live" | "reconnecting" | "polling" | "auth" | "offline".
 * Returns a function that stops everything.
 */
export function followEvents(onSnapshot, onStatus) {
  let stopped = false;
  let controller = null;
  let failures = 0;
  let timer = null;

  const sleep = (ms) => new Promise((r) => { timer = setTimeout(r, ms); });

  async function poll() {
    onStatus("polling");
    while (!stopped) {
      try {
        const resp = await api("v1/sessions", { headers: { Accept: "application/json" } });
        if (!resp.ok) throw await httpError(resp, "GET /v1/sessions failed");
        const body = await resp.json();
        onSnapshot(Array.isArray(body) ? { sessions: body } : body);
        onStatus("polling");
      } catch (e) {
        onStatus(e instanceof AuthError ? "auth" : "offline", e);
      }
      await sleep(1000);
    }
  }

  async function stream() {
    while (!stopped) {
      onStatus(failures ? "reconnecting" : "connecting");
      controller = new AbortController();
      try {
        const resp = await api("v1/events", { headers: { Accept: "text/event-stream" }, signal: controller.signal });
        if (resp.status === 404 || resp.status === 405 || resp.status === 501) { poll(); return; }
        if (!resp.ok || !resp.body) throw await httpError(resp, "GET /v1/events failed");
        await readSse(resp.body, (event, data) => {
          // Signaling sends `sessions` ({sessions}) and `health` ({processes}) events; a
          // combined {sessions, processes} snapshot in either is understood too.
          if (event !== "sessions" && event !== "health" && event !== "message") return;
          let parsed;
          try { parsed = JSON.parse(data); } catch { return; }
          failures = 0;
          onStatus("live");
          onSnapshot(Array.isArray(parsed) ? { sessions: parsed } : parsed);
        });
        if (stopped) return;
        throw new Error("The event stream ended.");
      } catch (e) {
        if (stopped) return;
        failures += 1;
        onStatus(e instanceof AuthError ? "auth" : (e instanceof UnreachableError || failures > 2 ? "offline" : "reconnecting"), e);
        if (e instanceof AuthError) return; // wait for a token; the page restarts us
        await sleep(Math.min(500 * 2 ** Math.min(failures, 4), 5000));
      }
    }
  }

  stream();
  return () => { stopped = true; clearTimeout(timer); if (controller) controller.abort(); };
}

/** Minimal text/event-stream parser (WHATWG HTML §9.2.6): event + data fields, blank line dispatches. */
async function readSse(body, dispatch) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  let event = "";
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let nl;
    while ((nl = buf.search(/\r\n|\r|\n/)) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + (buf[nl] === "\r" && buf[nl + 1] === "\n" ? 2 : 1));
      if (line === "") {
        if (data.length) dispatch(event || "message", data.join("\n"));
        event = ""; data = [];
        continue;
      }
      if (line.startsWith(":")) continue; // comment / keep-alive
      const i = line.indexOf(":");
      const field = i < 0 ? line : line.slice(0, i);
      let val = i < 0 ? "" : line.slice(i + 1);
      if (val.startsWith(" ")) val = val.slice(1);
      if (field === "event") event = val;
      else if (field === "data") data.push(val);
    }
  }
}

// ---------------------------------------------------------------------------- formatting

export const dash = "–";

export function fmtNum(n) {
  return typeof n === "number" && Number.isFinite(n) ? n.toLocaleString("en-US") : dash;
}

export function fmtMs(ms, digits = 1) {
  if (typeof ms !== "number" || !Number.isFinite(ms)) return dash;
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(ms >= 100 ? 0 : digits)} ms`;
}

/** `loss` is a fraction 0…1 (RTCP "fraction lost"); shown as a percentage. */
export function fmtLoss(loss) {
  if (typeof loss !== "number" || !Number.isFinite(loss)) return dash;
  return `${(loss * 100).toFixed(loss > 0 && loss < 0.01 ? 2 : 1)} %`;
}

export function fmtBitrate(bps) {
  if (typeof bps !== "number" || !Number.isFinite(bps)) return dash;
  if (bps >= 1e6) return `${(bps / 1e6).toFixed(2)} Mbit/s`;
  return `${(bps / 1e3).toFixed(1)} kbit/s`;
}

export function fmtDuration(seconds) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds) || seconds < 0) return dash;
  const s = Math.floor(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const pad = (x) => String(x).padStart(2, "0");
  return h ? `${h}:${pad(m)}:${pad(s % 60)}` : `${m}:${pad(s % 60)}`;
}

export function fmtTime(unixSeconds) {
  if (typeof unixSeconds !== "number") return dash;
  return new Date(unixSeconds * 1000).toLocaleTimeString();
}

export function shortId(id) {
  return id && id.length > 10 ? `${id.slice(0, 8)}…` : (id || dash);
}

/** document.createElement with attributes and children, enough to build rows without innerHTML. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElementNS(
    tag === "svg" || tag === "polyline" || tag === "line" ? "http://www.w3.org/2000/svg" : "http://www.w3.org/1999/xhtml",
    tag,
  );
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c);
  return el;
}

// ---------------------------------------------------------------------------- charts

// The setup steps of docs/control-protocol.md, in order, with the phase each one ends.
const STEPS = [
  ["answer_sent", "answer", "Answer sent"],
  ["first_stun", "ice", "First STUN"],
  ["ice_nominated", "ice", "ICE nominated"],
  ["dtls_done", "dtls", "DTLS done"],
  ["first_rtp_in", "audio", "First audio in"],
  ["first_rtp_out", "audio", "First audio out"],
];
const PHASES = [["answer", "Answer"], ["ice", "ICE"], ["dtls", "DTLS"], ["audio", "First audio"]];

/**
 * The setup timeline (offer → answer → ICE → DTLS → first audio) as a bar with one
 * segment per phase, proportional to its duration, plus every step as a list (which is also
 * what a screen reader reads). `timeline` holds ms since the offer was received, null for
 * steps not reached yet; `omit` names steps left out (the demo leaves out the agent's first
 * audio out, which for an assistant is after the caller's first sentence, not setup).
 */
export function renderTimeline(container, timeline, heading = "Setup timeline", omit = []) {
  container.replaceChildren();
  const tl = timeline || {};
  const at = (k) => (!omit.includes(k) && typeof tl[k] === "number" && Number.isFinite(tl[k]) ? tl[k] : null);
  const reached = STEPS.filter(([k]) => at(k) !== null);
  const total = reached.length ? Math.max(...reached.map(([k]) => at(k))) : 0;
  container.append(h("h3", { text: `${heading}${total ? `: ${fmtMs(total)}` : ""}` }));
  const bar = h("div", { class: "tl-bar", "aria-hidden": "true" });
  let prev = 0;
  for (const [phase, label] of PHASES) {
    const ends = STEPS.filter(([k, p]) => p === phase && at(k) !== null).map(([k]) => at(k));
    if (!ends.length) continue;
    const end = Math.max(prev, ...ends);
    const dur = end - prev;
    const pct = total ? (dur / total) * 100 : 0;
    bar.append(h("div", {
      class: "tl-seg", "data-phase": phase, style: `flex: ${pct} 0 0`,
      title: `${label}: ${fmtMs(dur)} (done at ${fmtMs(end)})`, text: pct > 12 ? `${label} ${fmtMs(dur)}` : "",
    }));
    prev = end;
  }
  if (!reached.length) bar.append(h("div", { class: "tl-seg", "data-phase": "pending", style: "flex: 1 0 0" }));
  container.append(bar);
  const list = h("ol", { class: "tl-steps" },
    h("li", {}, "Offer received ", h("b", { text: "0 ms" })),
    ...STEPS.filter(([key]) => !omit.includes(key)).map(([key, phase, label]) => h("li",
      { "data-phase": at(key) !== null ? phase : null },
      `${label} `, h("b", { text: at(key) !== null ? fmtMs(at(key)) : "pending" }))));
  container.append(list);
}

/** A sparkline of the last values (nulls skipped) as inline SVG, with a text equivalent. */
export function renderSparkline(container, label, values, format) {
  const nums = values.filter((v) => typeof v === "number" && Number.isFinite(v));
  const last = nums.length ? nums[nums.length - 1] : null;
  const W = 120;
  const H = 30;
  const min = nums.length ? Math.min(...nums) : 0;
  const max = nums.length ? Math.max(...nums) : 0;
  const span = max - min || 1;
  const step = values.length > 1 ? W / (values.length - 1) : W;
  const pts = [];
  values.forEach((v, i) => {
    if (typeof v !== "number" || !Number.isFinite(v)) return;
    pts.push(`${(i * step).toFixed(1)},${(H - 2 - ((v - min) / span) * (H - 4)).toFixed(1)}`);
  });
  const summary = nums.length
    ? `${label}: now ${format(last)}, min ${format(min)}, max ${format(max)} over the last ${nums.length} samples`
    : `${label}: no data yet`;
  container.replaceChildren(
    h("div", { class: "label" }, h("span", { text: label }), h("b", { text: format(last) })),
    h("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img", "aria-label": summary },
      pts.length ? h("polyline", { points: pts.length === 1 ? `0,${pts[0].split(",")[1]} ${W},${pts[0].split(",")[1]}` : pts.join(" ") }) : null),
  );
}

// ---------------------------------------------------------------------------- turns

// A turn's marks (the session object's `turns`, appliance/session_info.py: ms after the
// end of the turn was decided, negative before it), in the order they happen, with the
// phase each one ends. `null` is the end of turn itself (0 ms).
const TURN_MARKS = [
  ["speech_start_ms", null, "Speech started"],
  ["speech_end_ms", "speech", "Speech ended (VAD pause)"],
  [null, "wait", "End of turn"],
  ["transcript_ms", "stt", "Transcript"],
  ["first_token_ms", "llm", "First token"],
  ["first_audio_ms", "tts", "First audio"],
  ["first_sent_ms", "send", "First frame sent"],
];
const TURN_PHASES = {
  speech: "Speech", wait: "End of turn", stt: "Transcript", llm: "LLM", tts: "TTS", send: "Send",
};

function turnMark(turn, key) {
  if (key === null) return 0;
  const v = turn[key];
  return typeof v === "number" && Number.isFinite(v) ? v : null;
}

const signedMs = (ms) => `${ms < 0 ? "−" : "+"}${fmtMs(Math.abs(ms))}`;

/**
 * Each turn's waterfall (issue 38 item 5) as a bar like the setup timeline's: from the
 * caller's speech start through the VAD's pause, the end of turn, the transcript, the LLM's
 * first token and the TTS's first frame to that frame sent, one segment per phase,
 * proportional to its duration. A heading says how long the caller waited (end of speech →
 * first frame sent, what /metrics calls appliance_turn_first_sent_seconds) and a list gives
 * every mark from the end of speech (also what a screen reader reads). `turns` is the
 * session object's list; the container is hidden while there is none.
 */
export function renderTurns(container, turns, heading = "Turns") {
  const list = Array.isArray(turns) ? turns.filter((t) => t && typeof t.turn === "number") : [];
  container.hidden = !list.length;
  const title = heading ? [h("h3", { text: list.length ? `${heading} (${list.length})` : heading })] : [];
  container.replaceChildren(...title, ...list.map((t) => renderTurn(t)));
}

function renderTurn(turn) {
  const marks = TURN_MARKS.map(([key, phase, label]) => ({ key, phase, label, at: turnMark(turn, key) }));
  const reached = marks.filter((m) => m.at !== null);
  const origin = Math.min(...reached.map((m) => m.at));
  const total = Math.max(...reached.map((m) => m.at)) - origin;
  const pause = turnMark(turn, "speech_end_ms");
  const sent = turnMark(turn, "first_sent_ms");
  const ref = pause !== null ? pause : 0; // what the list counts from
  const bar = h("div", { class: "tl-bar turn-bar", "aria-hidden": "true" });
  let prev = origin;
  for (const m of marks) {
    if (m.phase === null || m.at === null) continue;
    // A mark before the one it follows (a reply begun at the pause has its first token
    // before the end of turn) draws as nothing: that work hid under the wait.
    const end = Math.max(prev, m.at);
    const dur = end - prev;
    const pct = total ? (dur / total) * 100 : 0;
    const label = TURN_PHASES[m.phase];
    bar.append(h("div", {
      class: "tl-seg", "data-phase": m.phase, style: `flex: ${pct} 0 0`,
      title: `${label}: ${fmtMs(dur)} (${m.label.toLowerCase()} at ${signedMs(m.at - ref)})`,
      text: pct > 14 ? `${label} ${fmtMs(dur)}` : "",
    }));
    prev = end;
  }
  const waited = pause !== null && sent !== null
    ? `reply sent ${fmtMs(sent - pause)} after the speech ended` : "no reply sent";
  // The list counts from the end of speech (the histograms do too), or from the end of
  // turn when the agent did not report the VAD's pause.
  const item = (phase, label, value) => h("li", { "data-phase": phase }, `${label} `, h("b", { text: value }));
  const start = turnMark(turn, "speech_start_ms");
  const steps = h("ol", { class: "tl-steps" },
    pause !== null && start !== null ? item("speech", "Speech", fmtMs(pause - start)) : null,
    ...marks.filter((m) => m.key !== "speech_start_ms").map((m) => (m.at === null
      ? item(null, m.label, "–") : item(m.phase, m.label, m.at === ref ? "0 ms" : signedMs(m.at - ref)))));
  return h("div", { class: "turn", "data-turn": String(turn.turn) },
    h("h4", { text: `Turn ${turn.turn}: ${waited}` }), bar, steps);
}
