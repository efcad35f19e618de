// The microphone demo (/demo): microphone → agent → speaker through the appliance.
//
// The browser is the offerer. The server is ICE-lite, so the offer needs no browser
// candidates: we wait for ICE gathering for at most ~200 ms and POST whatever we have; the
// browser then sends connectivity checks to the server's one candidate (the relay port).
//
// TURN (docs/turn.md): before the offer the page asks GET /v1/ice_servers for the
// appliance's TURN servers and a fresh credential, and gives them to its RTCPeerConnection
// (the WHIP Link headers come only with the answer, too late for the offer's ICE agent).
// Its relay candidates need not be in the offer either: the browser checks from them to
// the server's candidate whenever they are gathered. ?relay=1 sets iceTransportPolicy
// "relay": the call then goes through TURN or not at all (to try what a locked-down
// network or browser policy does).
//
// window.applianceDemo exposes the page state for tests and for the console.
import {
  AuthError, HttpError, UnreachableError, adoptTokenFromUrl, api, apiUrl, fmtMs, fmtNum, h,
  httpError, renderTimeline, renderTurns, setTokenAgent, wireAuthForm,
} from "./common.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
// Overridable for tests: how long media may take to connect before we call it failed.
const CONNECT_TIMEOUT_MS = Number(params.get("connect_timeout_ms")) || 15000;
const GATHER_MAX_MS = 200;
// ?relay=1: relayed candidates only (iceTransportPolicy "relay"), through the appliance's TURN.
const FORCE_RELAY = ["1", "true", "yes"].includes((params.get("relay") || "").toLowerCase());

let state = "idle";
let errorCode = null;
let run = null; // the current attempt; replaced on every Start so stale callbacks can tell
let lastStats = null;
let audioCtx = null;
const levels = { input: 0, output: 0 };

// ---------------------------------------------------------------------------- UI state

function setState(next, detail) {
  state = next;
  const el = $("state");
  el.dataset.state = next;
  el.textContent = next;
  $("state-detail").textContent = detail ? ` · ${detail}` : "";
  const busy = next === "starting" || next === "connecting" || next === "connected";
  $("start").disabled = busy;
  $("stop").disabled = !busy;
  $("agent").disabled = busy;
  $("agent-custom").disabled = busy;
}

/** kind: "error" | "warn" | "ok". code: a stable name tests and scripts can match. */
function showMessage(kind, code, title, text, { auth = false } = {}) {
  if (kind === "error") errorCode = code;
  const box = $("message");
  box.className = `banner ${kind}`;
  box.dataset.code = code;
  box.hidden = false;
  $("message-title").textContent = title;
  $("message-text").textContent = text;
  $("auth-form").hidden = !auth;
  $("play-audio").hidden = code !== "autoplay";
}

function clearMessage() {
  errorCode = null;
  $("message").hidden = true;
  delete $("message").dataset.code;
}

/** Whether r is still the page's run: not replaced by a new Start, and not being stopped. */
function current(r) {
  return r === run && !r.stopping;
}

function fail(r, code, title, text, opts) {
  if (!current(r)) return; // Stop (or a new Start) owns the page now
  showMessage("error", code, title, text, opts);
  teardown(r, false);
  setState("failed", title);
}

function chosenAgent() {
  const sel = $("agent").value;
  return sel === "custom" ? $("agent-custom").value.trim() : sel;
}

// ---------------------------------------------------------------------------- levels

function levelOf(analyser, buf) {
  analyser.getFloatTimeDomainData(buf);
  let sum = 0;
  for (let i = 0; i < buf.length; i++) sum += buf[i] * buf[i];
  const rms = Math.sqrt(sum / buf.length);
  const db = rms > 0 ? 20 * Math.log10(rms) : -Infinity;
  return { db, value: Math.min(Math.max((db + 60) / 60, 0), 1) };
}

function attachMeter(r, stream, which) {
  if (!audioCtx) return;
  const source = audioCtx.createMediaStreamSource(stream);
  const analyser = audioCtx.createAnalyser();
  analyser.fftSize = 1024;
  source.connect(analyser); // not to destination: the <audio> element does the playing
  const buf = new Float32Array(analyser.fftSize);
  const meter = $(`level-${which === "input" ? "in" : "out"}`);
  const out = $(`level-${which === "input" ? "in" : "out"}-db`);
  const timer = setInterval(() => {
    const { db, value } = levelOf(analyser, buf);
    levels[which] = value;
    meter.value = value;
    meter.textContent = value.toFixed(2);
    out.textContent = Number.isFinite(db) ? `${db.toFixed(0)} dBFS` : "silent";
  }, 60);
  r.cleanups.push(() => {
    clearInterval(timer);
    source.disconnect();
    levels[which] = 0;
    meter.value = 0;
    out.textContent = "–";
  });
}

// ---------------------------------------------------------------------------- stats

async function readStats(pc) {
  const report = await pc.getStats();
  const out = { inbound: null, outbound: null, rttMs: null, codec: null, connectionState: pc.connectionState };
  const codecs = {};
  report.forEach((s) => { if (s.type === "codec") codecs[s.id] = s; });
  report.forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio") {
      out.inbound = {
        packetsReceived: s.packetsReceived || 0, bytesReceived: s.bytesReceived || 0,
        packetsLost: s.packetsLost || 0, jitterMs: typeof s.jitter === "number" ? s.jitter * 1000 : null,
        totalAudioEnergy: s.totalAudioEnergy || 0, audioLevel: s.audioLevel || 0,
        totalSamplesReceived: s.totalSamplesReceived || 0,
      };
      if (codecs[s.codecId]) out.codec = `${codecs[s.codecId].mimeType}/${codecs[s.codecId].clockRate}`;
    } else if (s.type === "outbound-rtp" && s.kind === "audio") {
      out.outbound = { packetsSent: s.packetsSent || 0, bytesSent: s.bytesSent || 0 };
    } else if (s.type === "remote-inbound-rtp" && typeof s.roundTripTime === "number") {
      out.rttMs = s.roundTripTime * 1000;
    } else if (s.type === "candidate-pair" && s.nominated && typeof s.currentRoundTripTime === "number" && out.rttMs === null) {
      out.rttMs = s.currentRoundTripTime * 1000;
    }
  });
  return out;
}

function renderStats(st) {
  const i = st.inbound || {};
  const o = st.outbound || {};
  const rows = [
    ["Packets received / sent", `${fmtNum(i.packetsReceived)} / ${fmtNum(o.packetsSent)}`],
    ["Packets lost", fmtNum(i.packetsLost)],
    ["Jitter", fmtMs(i.jitterMs)],
    ["Round trip", fmtMs(st.rttMs)],
    ["Codec", st.codec || "–"],
  ];
  $("stats").replaceChildren(...rows.flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: v })]));
}

// ---------------------------------------------------------------------------- start

async function start() {
  if (run) teardown(run, false);
  const r = { pc: null, stream: null, sessionUrl: null, sessionId: null, iceServers: null, agent: "", cleanups: [], connected: false,
    t0: performance.now(), setupMs: null, micMs: null, answerMs: null, answeredAt: null, serverTimeline: null,
    turns: null, stopping: false,
    restart: { attempts: 0, episode: 0, recovered: 0, running: false, pending: false, timer: null, startedAt: null, recoveredAt: null, lostAt: null, lostMs: null, last: null } };
  run = r;
  clearMessage();
  lastStats = null;
  $("setup-ms").textContent = "–";
  $("setup-parts").textContent = "";
  $("server-timeline").replaceChildren();
  renderTurns($("turns"), null, "");
  $("stats").replaceChildren();
  $("transcript-log").replaceChildren();
  transcript.length = 0;
  turns.length = 0;
  setState("starting", "asking for the microphone");
  // The agent is chosen at Start: a client token (when the API needs one) is minted for it,
  // and the first request below may be the one that mints it.
  r.agent = chosenAgent();
  setTokenAgent(r.agent);
  // The TURN servers, asked while the microphone prompt is up (settled, never rejected: a
  // failure is judged below, once the microphone is ours).
  const iceAsked = fetchIceServers().then((servers) => ({ servers }), (error) => ({ error }));

  // 1. Microphone. Browsers only offer it to secure contexts (https or localhost).
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    return fail(r, "insecure", "The microphone is not available on this page",
      window.isSecureContext
        ? "This browser does not support getUserMedia."
        : "Browsers only give the microphone to secure pages. Open the demo over https:// (start the appliance with --tls self-signed or a certificate) or at http://localhost.");
  }
  // An AudioContext made during the click may start; one made later may be suspended.
  try {
    audioCtx = audioCtx || new AudioContext();
    audioCtx.resume().catch(() => {});
  } catch { audioCtx = null; }
  try {
    r.stream = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
  } catch (e) {
    if (e && (e.name === "NotAllowedError" || e.name === "SecurityError" || e.name === "PermissionDeniedError")) {
      return fail(r, "mic-denied", "Microphone access was denied",
        "The demo needs your microphone. Allow it for this site (the microphone or lock icon in the address bar), then press Start again.");
    }
    if (e && (e.name === "NotFoundError" || e.name === "OverconstrainedError" || e.name === "DevicesNotFoundError")) {
      return fail(r, "mic-missing", "No microphone found", "Connect a microphone (or headset), then press Start again.");
    }
    if (e && (e.name === "NotReadableError" || e.name === "TrackStartError" || e.name === "AbortError")) {
      return fail(r, "mic-busy", "The microphone could not be opened", "Another application may be using it. Close it, then press Start again.");
    }
    return fail(r, "mic-error", "The microphone could not be opened", String(e && e.message ? e.message : e));
  }
  if (!current(r)) { r.stream.getTracks().forEach((t) => t.stop()); return; }
  r.micMs = performance.now() - r.t0;
  r.cleanups.push(() => r.stream.getTracks().forEach((t) => t.stop()));
  attachMeter(r, r.stream, "input");

  // 2. ICE servers (TURN), then the offer.
  const ice = await iceAsked;
  if (!current(r)) return;
  if (ice.error) {
    const e = ice.error;
    if (e instanceof UnreachableError) return fail(r, "unreachable", "The server is unreachable", e.message);
    if (e instanceof AuthError) return fail(r, "auth", "Access token required", e.message, { auth: true });
    // Anything else: TURN is a fallback; the direct path may still work (unless forced).
    if (FORCE_RELAY) return fail(r, "no-turn", "The TURN servers are not available", e.message || String(e));
    ice.servers = [];
  }
  r.iceServers = ice.servers;
  if (FORCE_RELAY && !ice.servers.length) {
    return fail(r, "no-turn", "No TURN server to relay through",
      "The page was opened with ?relay=1 (relayed candidates only), but this appliance advertises no TURN server (it was started with --no-turn, or without a public address).");
  }
  setState("connecting", FORCE_RELAY ? "sending the offer (relay only)" : "sending the offer");
  const pc = new RTCPeerConnection({
    bundlePolicy: "max-bundle", rtcpMuxPolicy: "require", iceServers: ice.servers,
    ...(FORCE_RELAY ? { iceTransportPolicy: "relay" } : {}),
  });
  r.pc = pc;
  r.cleanups.push(() => pc.close());
  r.cleanups.push(() => clearTimeout(r.restart.timer));
  for (const track of r.stream.getAudioTracks()) pc.addTrack(track, r.stream);
  // A data channel beside the audio (RFC 8831): created before the offer, so the offer
  // carries the application m= section; channels the agent opens arrive in ondatachannel.
  attachChannel(r, pc.createDataChannel("chat"));
  attachTranscript(r, pc.createDataChannel("transcript")); // the assistant's words, both sides
  pc.ondatachannel = (ev) => attachChannel(r, ev.channel);
  pc.ontrack = (ev) => onTrack(r, ev);
  pc.onconnectionstatechange = () => onConnectionState(r);
  let answerSdp;
  try {
    await pc.setLocalDescription(await pc.createOffer());
    await gathered(pc, GATHER_MAX_MS);
    if (!current(r)) return;
    const agent = r.agent;
    const path = `v1/sessions${agent ? `?agent=${encodeURIComponent(agent)}` : ""}`;
    const tPost = performance.now();
    const resp = await api(path, {
      method: "POST",
      headers: { "Content-Type": "application/sdp", Accept: "application/sdp" },
      body: pc.localDescription.sdp,
    });
    const loc = resp.headers.get("Location");
    if (loc && (resp.status === 201 || resp.status === 200)) {
      r.sessionUrl = new URL(loc, resp.url || apiUrl("v1/sessions")).toString();
      r.sessionId = decodeURIComponent(new URL(r.sessionUrl).pathname.split("/").filter(Boolean).pop());
    }
    if (!current(r)) {
      // Stopped (or restarted) while the offer was in flight: the server made a session
      // nobody will use; end it now rather than leave it to the consent timeout.
      deleteSession(r);
      return;
    }
    if (resp.status !== 201 && resp.status !== 200) throw await httpError(resp, "The server refused the session");
    r.answeredAt = performance.now();
    r.answerMs = r.answeredAt - tPost;
    answerSdp = await resp.text();
  } catch (e) {
    if (e instanceof UnreachableError) return fail(r, "unreachable", "The server is unreachable", e.message);
    if (e instanceof AuthError) return fail(r, "auth", "Access token required", e.message, { auth: true });
    if (e instanceof HttpError) return fail(r, "server", "The server refused the session", e.message);
    return fail(r, "offer", "Could not create the offer", String(e && e.message ? e.message : e));
  }

  // 3. Answer.
  try {
    await pc.setRemoteDescription({ type: "answer", sdp: answerSdp });
  } catch (e) {
    deleteSession(r);
    return fail(r, "bad-answer", "The server's answer could not be used", String(e && e.message ? e.message : e));
  }
  if (!current(r)) return;
  const target = candidateAddresses(answerSdp);
  setState("connecting", `connecting media to ${target || "the server"}`);
  const connectTimer = setTimeout(() => {
    if (r === run && !r.connected) connectionFailed(r, target);
  }, CONNECT_TIMEOUT_MS);
  r.cleanups.push(() => clearTimeout(connectTimer));
  watchFirstAudio(r);
  pollSession(r);
}

/** The appliance's TURN servers as RTCIceServer objects, with a credential minted for this
 * call (GET /v1/ice_servers); [] when it advertises none (or is too old to say). */
async function fetchIceServers() {
  const resp = await api("v1/ice_servers", { headers: { Accept: "application/json" } });
  if (resp.status === 404) return [];
  if (!resp.ok) throw await httpError(resp, "Could not get the TURN servers");
  const body = await resp.json();
  return body && Array.isArray(body.ice_servers) ? body.ice_servers : [];
}

function gathered(pc, maxMs) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => { clearTimeout(t); pc.removeEventListener("icegatheringstatechange", check); resolve(); };
    const check = () => { if (pc.iceGatheringState === "complete") done(); };
    const t = setTimeout(done, maxMs);
    pc.addEventListener("icegatheringstatechange", check);
  });
}

function candidateAddresses(sdp) {
  const out = [];
  for (const m of sdp.matchAll(/^a=candidate:\S+ \d+ udp \d+ (\S+) (\d+)/gim)) {
    out.push(m[1].includes(":") ? `[${m[1]}]:${m[2]}` : `${m[1]}:${m[2]}`);
  }
  return [...new Set(out)].join(", ");
}

// ---------------------------------------------------------------------------- messages

const MAX_LOG = 200;

function chatState(text, open) {
  const el = $("chat-state");
  el.textContent = text;
  el.dataset.state = open ? "open" : "closed";
  $("chat-text").disabled = !open;
  $("chat-send").disabled = !open;
}

function chatLog(who, label, data) {
  const li = document.createElement("li");
  li.className = `msg msg-${who}`;
  const text = typeof data === "string" ? data : `[binary, ${data.byteLength} bytes]`;
  const tag = label === "chat" ? "" : ` (${label})`;
  li.textContent = `${who === "you" ? "you" : "agent"}${tag}: ${text}`;
  const log = $("chat-log");
  log.append(li);
  while (log.childElementCount > MAX_LOG) log.firstElementChild.remove();
  li.scrollIntoView({ block: "nearest" });
}

function attachChannel(r, dc) {
  dc.binaryType = "arraybuffer";
  if (dc.label === "chat") r.chat = dc;
  dc.onopen = () => { if (r === run && dc === r.chat) chatState("open", true); };
  dc.onclose = () => { if (r === run && dc === r.chat) chatState("closed", false); };
  dc.onmessage = (ev) => { if (r === run) chatLog("agent", dc.label, ev.data); };
  if (dc.label === "transcript") attachTranscript(r, dc); // (an agent-opened one)
  r.cleanups.push(() => { dc.onopen = dc.onclose = dc.onmessage = null; chatState("closed", false); });
}

// ---------------------------------------------------------------------------- transcript

const transcript = []; // {who: "user" | "agent", text, final} (tests read it)
const turns = []; // {event: "started" | "stopped", at}: the assistant's turn detector

function transcriptLine(who, text, final, extra = {}) {
  const log = $("transcript-log");
  const last = log.lastElementChild;
  // A user partial is replaced by the next partial and by the final of the same turn.
  if (last && last.classList.contains("line-user-partial") && who === "user") {
    last.remove();
    transcript.pop();
  }
  if (!text) return;
  const li = document.createElement("li");
  li.className = `msg line-${who}${final ? "" : "-partial"}`;
  li.textContent = `${who === "user" ? "you" : "agent"}: ${text}`;
  log.append(li);
  transcript.push({ who, text, final, at: performance.now(), ...extra });
  while (log.childElementCount > MAX_LOG) { log.firstElementChild.remove(); transcript.shift(); }
  li.scrollIntoView({ block: "nearest" });
}

function onTranscriptEvent(ev) {
  if (!ev || typeof ev.type !== "string") return;
  if (ev.type === "transcript.user.started" || ev.type === "transcript.user.stopped") {
    turns.push({ event: ev.type.slice("transcript.user.".length), at: performance.now() });
    $("transcript-h").dataset.listening = ev.type.endsWith("started") ? "yes" : "no";
  } else if (ev.type === "transcript.user.partial") transcriptLine("user", ev.text, false);
  else if (ev.type === "transcript.user.final") transcriptLine("user", ev.text, true);
  else if (ev.type === "transcript.user.failed") transcriptLine("user", "(not understood)", true);
  else if (ev.type === "transcript.agent") transcriptLine("agent", ev.text, true);
  else if (ev.type === "output.cleared") {
    transcriptLine("agent", "(interrupted)", true,
      { interrupted: true, playedSeconds: ev.played_seconds, droppedSeconds: ev.dropped_seconds });
  }
}

function attachTranscript(r, dc) {
  dc.onmessage = (ev) => {
    if (r !== run || typeof ev.data !== "string") return;
    try { onTranscriptEvent(JSON.parse(ev.data)); } catch { /* not ours */ }
  };
  r.cleanups.push(() => { dc.onmessage = null; });
}

function sendChat() {
  const r = run;
  const input = $("chat-text");
  const text = input.value;
  if (!r || !r.chat || r.chat.readyState !== "open" || !text) return;
  r.chat.send(text);
  chatLog("you", "chat", text);
  input.value = "";
  input.focus();
}

function onTrack(r, ev) {
  if (r !== run) return;
  const stream = ev.streams[0] || new MediaStream([ev.track]);
  const audio = $("remote-audio");
  audio.srcObject = stream;
  audio.play().catch(() => {
    showMessage("warn", "autoplay", "The browser blocked playback", "Press the button to hear the agent.");
  });
  attachMeter(r, stream, "output");
}

function onConnectionState(r) {
  if (r !== run) return;
  const cs = r.pc.connectionState;
  if (cs === "connected") {
    r.connected = true;
    if (r.setupMs === null) showSetup(r);
    if (r.restart && r.restart.pending) {
      r.restart.pending = false;
      r.restart.recovered += 1;
      r.restart.recoveredAt = performance.now();
      r.restart.lostMs = r.restart.lostAt === null ? null : Math.round(r.restart.recoveredAt - r.restart.lostAt);
      r.restart.last = { lostAt: r.restart.lostAt, startedAt: r.restart.startedAt, recoveredAt: r.restart.recoveredAt };
      r.restart.episode = 0; // the next loss gets its own MAX_ICE_RESTARTS
    }
    r.restart.lostAt = null; // (also when consent brought it back without a restart)
    if (state !== "ended") setState("connected", "talk now");
  } else if (cs === "disconnected" && r.connected) {
    if (r.restart.lostAt === null) r.restart.lostAt = performance.now();
    setState("connected", "connection interrupted, waiting for it to recover");
    scheduleIceRestart(r, RESTART_AFTER_DISCONNECT_MS);
  } else if (cs === "failed" && r.connected && r.restart.episode < MAX_ICE_RESTARTS) {
    if (r.restart.lostAt === null) r.restart.lostAt = performance.now();
    setState("connected", "connection lost, finding a new path (ICE restart)");
    scheduleIceRestart(r, 0);
  } else if (cs === "failed" || cs === "closed") {
    if (r.connected) {
      connectionLost(r);
    } else {
      connectionFailed(r, candidateAddresses(r.pc.remoteDescription ? r.pc.remoteDescription.sdp : ""));
    }
  }
}

/**
 * ICE restart (RFC 8445 §2.4, WHIP's PATCH, RFC 9725 §4.4.1): when the media path of a call
 * that was connected goes away — the network changed, or the connection it used died (TURN
 * over TCP or TLS ends with the relay worker that held it: docs/turn.md) — the page makes
 * an offer with new ICE credentials, PATCHes its ICE lines to the session, and sets the
 * server's new credentials and candidates as the answer. DTLS and SRTP carry on over the
 * new path: only ICE restarts. "disconnected" waits RESTART_AFTER_DISCONNECT_MS (consent
 * checks may recover it alone); "failed" restarts at once; after MAX_ICE_RESTARTS the call
 * is lost as before.
 */
const RESTART_AFTER_DISCONNECT_MS = Number(params.get("restart_after_ms")) || 1000;
const MAX_ICE_RESTARTS = 3;

function scheduleIceRestart(r, delayMs) {
  if (r.restart.timer !== null || r.restart.running) return;
  r.restart.timer = setTimeout(() => {
    r.restart.timer = null;
    const cs = r.pc ? r.pc.connectionState : "closed";
    if (r !== run || (cs !== "disconnected" && cs !== "failed")) return;
    if (r.restart.episode >= MAX_ICE_RESTARTS || !r.sessionUrl) connectionLost(r);
    else restartIce(r);
  }, delayMs);
}

async function restartIce(r) {
  if (r.restart.running) return;
  r.restart.running = true;
  r.restart.attempts += 1;
  r.restart.episode += 1;
  r.restart.pending = true;
  r.restart.startedAt = performance.now();
  const pc = r.pc;
  try {
    pc.restartIce();
    // No wait for gathering: the server is ICE-lite and needs only the new credentials, and
    // the browser gathers (allocates again) while the PATCH is on its way.
    await pc.setLocalDescription(await pc.createOffer({ iceRestart: true }));
    if (r !== run) return;
    const resp = await api(r.sessionUrl, {
      method: "PATCH",
      headers: { "Content-Type": "application/trickle-ice-sdpfrag", "If-Match": "*" },
      body: iceFragment(pc.localDescription.sdp),
    });
    if (resp.status !== 200) throw await httpError(resp, "The server refused the ICE restart");
    const frag = await resp.text();
    if (r !== run) return;
    await pc.setRemoteDescription({ type: "answer", sdp: restartedAnswer(pc.remoteDescription.sdp, frag) });
    restartNote(r, `ICE restart ${r.restart.attempts}: checking the new path`);
  } catch (e) {
    r.restart.pending = false;
    // The session is gone (ended on the server): nothing to restart.
    if (e instanceof HttpError && (e.status === 404 || e.status === 409 || e.status === 410)) r.restart.episode = MAX_ICE_RESTARTS;
    restartNote(r, `ICE restart ${r.restart.attempts} failed: ${e && e.message ? e.message : e}`);
    if (r === run && pc.signalingState === "have-local-offer") {
      try { await pc.setLocalDescription({ type: "rollback" }); } catch (_) { /* closed */ }
    }
  } finally {
    r.restart.running = false;
  }
  const cs = pc.connectionState;
  if (r === run && (cs === "failed" || cs === "disconnected")) scheduleIceRestart(r, RESTART_AFTER_DISCONNECT_MS);
}

function restartNote(r, text) {
  console.info(text);
  if (r === run && state === "connected") setState("connected", text);
}

/** The ICE lines of an offer as a trickle-ice-sdpfrag (RFC 8840 §9): credentials, the
 * BUNDLE group, the first m= section's line, mid and candidates. */
function iceFragment(sdp) {
  const lines = sdp.split(/\r?\n/);
  const first = (prefix) => lines.find((l) => l.startsWith(prefix));
  const m0 = lines.findIndex((l) => l.startsWith("m="));
  const end = lines.findIndex((l, i) => i > m0 && l.startsWith("m="));
  const media = lines.slice(m0, end < 0 ? lines.length : end);
  const out = [first("a=ice-ufrag:"), first("a=ice-pwd:"), first("a=group:BUNDLE"), lines[m0],
    media.find((l) => l.startsWith("a=mid:")), ...media.filter((l) => l.startsWith("a=candidate:")),
    "a=end-of-candidates"];
  return out.filter(Boolean).join("\r\n") + "\r\n";
}

/** The call's answer with the ICE restart's credentials and candidates (the PATCH's 200
 * body) in place of the old ones; candidates go in the first (the bundled) m= section. */
function restartedAnswer(sdp, frag) {
  const pick = (re) => { const m = re.exec(frag); return m ? m[1].trim() : null; };
  const ufrag = pick(/^a=ice-ufrag:(.+)$/m), pwd = pick(/^a=ice-pwd:(.+)$/m);
  if (!ufrag || !pwd) throw new Error("the server's ICE restart answer has no ICE credentials");
  const candidates = frag.split(/\r?\n/).filter((l) => l.startsWith("a=candidate:"));
  const out = [];
  let sections = 0, placed = false;
  const place = () => { if (!placed) out.push(...candidates, "a=end-of-candidates"); placed = true; };
  for (const line of sdp.split(/\r\n/)) {
    if (line === "" || line.startsWith("a=candidate:") || line === "a=end-of-candidates") continue;
    if (line.startsWith("m=") && ++sections === 2) place();
    if (line.startsWith("a=ice-ufrag:")) out.push(`a=ice-ufrag:${ufrag}`);
    else if (line.startsWith("a=ice-pwd:")) out.push(`a=ice-pwd:${pwd}`);
    else out.push(line);
  }
  place();
  return out.join("\r\n") + "\r\n";
}

/** It worked and then stopped for good: ended on the server (e.g. End on the dashboard),
 * or lost (and the ICE restarts did not bring it back). */
function connectionLost(r) {
  checkEnded(r).then((ended) => {
    if (!ended && r === run) {
      fail(r, "connection-lost", "The connection was lost",
        "Media stopped reaching this browser and restarting ICE did not bring it back. The network may have changed, or the server went away.");
    }
  });
}

function connectionFailed(r, target) {
  deleteSession(r);
  fail(r, "connection-failed", "The connection failed",
    `No media connection to the server's UDP address ${target || "(none in the answer)"} within ${(CONNECT_TIMEOUT_MS / 1000).toFixed(0)} s. `
    + "UDP to that address may be blocked by a firewall, or the advertised address (appliance up --public-address) is not reachable from this browser.");
}

/**
 * Setup is connect time (issue 38 item 8c): Start → the peer connection is connected (ICE
 * and DTLS done). The first audio from the agent is not setup: the echo sends it at once,
 * but an assistant speaks only after your first sentence, so that wait was the sentence and
 * the reply. Its turns are timed on their own, in the Turns panel.
 */
function showSetup(r) {
  r.setupMs = Math.round(performance.now() - r.t0);
  $("setup-ms").textContent = `${r.setupMs} ms`;
  const ice = r.answeredAt !== null ? performance.now() - r.answeredAt : null;
  $("setup-parts").textContent = `Microphone access ${fmtMs(r.micMs)} · offer → answer ${fmtMs(r.answerMs)}`
    + ` · ICE and DTLS ${fmtMs(ice)} (the rest is making the offer).`;
}

/** The media stats, once a second (quickly at first, until the first audio packet). */
function watchFirstAudio(r) {
  let timer = null;
  let heard = false;
  const tick = async () => {
    if (r !== run || !r.pc || r.pc.connectionState === "closed") return;
    try {
      const st = await readStats(r.pc);
      if (r !== run) return;
      lastStats = st;
      renderStats(st);
      heard = heard || Boolean(st.inbound && st.inbound.packetsReceived > 0);
    } catch { /* the connection closed under us */ }
    timer = setTimeout(tick, heard ? 1000 : 25);
  };
  tick();
  r.cleanups.push(() => clearTimeout(timer));
}

/** GET the session once a second: the server timeline, and whether it ended (dashboard End). */
function pollSession(r) {
  let timer = null;
  const tick = async () => {
    if (r !== run) return;
    if (await checkEnded(r)) return;
    timer = setTimeout(tick, 1000);
  };
  timer = setTimeout(tick, 300);
  r.cleanups.push(() => clearTimeout(timer));
}

/** Returns true (and moves the page to "ended") when the server says the session is over. */
async function checkEnded(r) {
  if (!r.sessionUrl || r !== run) return false;
  let resp;
  try {
    resp = await api(new URL(r.sessionUrl).pathname.replace(/^\//, ""), { headers: { Accept: "application/json" } });
  } catch {
    return false; // unreachable for a moment: media may still flow; the connection state decides
  }
  if (r !== run) return true;
  if (resp.status === 404 || resp.status === 410) {
    ended(r, "The server no longer knows this session (it was ended, e.g. from the dashboard).");
    return true;
  }
  if (!resp.ok) return false;
  let s;
  try { s = await resp.json(); } catch { return false; }
  if (s && s.session) s = s.session;
  if (s && s.timeline) {
    r.serverTimeline = s.timeline;
    // Connect steps only: the server's first audio out is the agent's first words (an
    // assistant's come after your first sentence); those are timed as turns.
    renderTimeline($("server-timeline"), s.timeline, "Server timeline", ["first_rtp_out"]);
  }
  if (s && Array.isArray(s.turns)) {
    r.turns = s.turns;
    renderTurns($("turns"), s.turns, "");
  }
  if (s && s.state === "ended") {
    ended(r, `The session was ended${s.end_reason ? `: ${s.end_reason}` : ""}.`);
    return true;
  }
  return false;
}

function ended(r, text) {
  if (r !== run) return;
  teardown(r, false);
  showMessage("ok", "ended", "Session ended", text);
  setState("ended", r.sessionId ? `session ${r.sessionId}` : "");
}

function deleteSession(r) {
  if (!r.sessionUrl) return Promise.resolve();
  const path = new URL(r.sessionUrl).pathname.replace(/^\//, "");
  const url = r.sessionUrl;
  r.sessionUrl = null;
  return api(path, { method: "DELETE", keepalive: true }).catch(() => {
    void url; // the server will reap it (no consent for 30 s)
  });
}

/** Stop media and timers. Keeps the numbers on screen. */
function teardown(r, del) {
  if (del) deleteSession(r);
  const cleanups = r.cleanups.splice(0);
  for (const c of cleanups.reverse()) {
    try { c(); } catch { /* already gone */ }
  }
  $("remote-audio").srcObject = null;
}

async function stop() {
  const r = run;
  if (!r) return;
  r.stopping = true;
  setState("stopping", "ending the session");
  if (r.pc) {
    try { lastStats = await readStats(r.pc); } catch { /* closed */ }
  }
  await deleteSession(r);
  teardown(r, false);
  showMessage("ok", "stopped", "Session ended", "You stopped the session.");
  setState("ended", r.sessionId ? `session ${r.sessionId}` : "");
}

// ---------------------------------------------------------------------------- wiring

adoptTokenFromUrl();
$("controls").addEventListener("submit", (ev) => { ev.preventDefault(); start(); });
$("chat-form").addEventListener("submit", (ev) => { ev.preventDefault(); sendChat(); });
$("stop").addEventListener("click", () => stop());
$("agent").addEventListener("change", () => {
  const custom = $("agent").value === "custom";
  $("custom-field").hidden = !custom;
  if (custom) $("agent-custom").focus();
});
$("play-audio").addEventListener("click", () => {
  $("remote-audio").play().then(clearMessage).catch(() => {});
});
wireAuthForm($("auth-form"), () => start());
window.addEventListener("pagehide", () => { if (run) teardown(run, true); });

const preset = params.get("agent");
if (preset !== null) {
  const known = [...$("agent").options].some((o) => o.value === preset && o.value !== "custom");
  $("agent").value = known ? preset : "custom";
  if (!known) { $("agent-custom").value = preset; $("custom-field").hidden = false; }
}

window.applianceDemo = {
  get state() { return state; },
  get error() { return errorCode; },
  get message() { return $("message").hidden ? null : `${$("message-title").textContent}: ${$("message-text").textContent}`; },
  get sessionId() { return run ? run.sessionId : null; },
  /** The TURN servers this call's RTCPeerConnection was given, and whether only relayed
   * candidates were allowed (?relay=1). */
  get iceServers() { return run && run.iceServers ? run.iceServers.map((s) => ({ urls: s.urls })) : []; },
  get relayOnly() { return FORCE_RELAY; },
  /** ICE restarts of this call (the path went away and the page found a new one). */
  get iceRestarts() {
    const x = run ? run.restart : null;
    return x ? { attempts: x.attempts, recovered: x.recovered, pending: x.pending,
      // the restart itself (offer, PATCH, checks), and from the path going to it being back
      tookMs: x.recoveredAt !== null && x.startedAt !== null ? Math.round(x.recoveredAt - x.startedAt) : null,
      lostMs: x.lostMs, last: x.last ? { ...x.last } : null } : null;
  },
  get setupMs() { return run ? run.setupMs : null; },
  get serverTimeline() { return run ? run.serverTimeline : null; },
  /** The session object's `turns`: each turn's waterfall, as the Turns panel draws it. */
  get waterfalls() { return run && run.turns ? run.turns.map((t) => ({ ...t })) : []; },
  get levels() { return { ...levels }; },
  get transcript() { return transcript.map((t) => ({ ...t })); },
  get turns() { return turns.map((t) => ({ ...t })); },
  /** Mute (false) or unmute the microphone track: the agent then gets silence. */
  setMicEnabled(on) {
    if (run && run.stream) run.stream.getAudioTracks().forEach((t) => { t.enabled = !!on; });
  },
  async stats() {
    if (run && run.pc && run.pc.connectionState !== "closed") {
      try { lastStats = await readStats(run.pc); } catch { /* closed */ }
    }
    return lastStats;
  },
  start, stop,
};
