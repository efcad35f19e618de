// A data-channel harness for tests/browser/test_datachannels_chromium.py, evaluated in a
// page the appliance serves (same origin as /v1/sessions). It makes its own
// RTCPeerConnection with the fake microphone and the channels the test names, and keeps
// every message each channel receives, so the test can compare what came back.
window.dcHarness = (() => {
  const t = { pc: null, chans: {}, got: {}, closed: {}, sid: null, answer: null };

  const until = (cond, ms, what) => new Promise((resolve, reject) => {
    const t0 = performance.now();
    const tick = () => {
      if (cond()) return resolve();
      if (performance.now() - t0 > ms) return reject(new Error(`timed out: ${what()}`));
      setTimeout(tick, 10);  // a poll interval: the condition is checked, not assumed
    };
    tick();
  });

  function watch(dc) {
    dc.binaryType = "arraybuffer";
    t.chans[dc.label] = dc;
    t.got[dc.label] = [];
    t.closed[dc.label] = false;
    dc.onmessage = (ev) => t.got[dc.label].push(ev.data);
    dc.onclose = () => { t.closed[dc.label] = true; };
  }

  // audio=false is the data-only variant: no microphone, no track, so the offer has only
  // an m=application section (RFC 8841 without audio).
  async function connect(agent, channels, audio = true) {
    const pc = new RTCPeerConnection({ bundlePolicy: "max-bundle", rtcpMuxPolicy: "require" });
    t.pc = pc;
    if (audio) {
      const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
      for (const track of stream.getAudioTracks()) pc.addTrack(track, stream);
    }
    for (const [label, opts] of channels) watch(pc.createDataChannel(label, opts));
    pc.ondatachannel = (ev) => watch(ev.channel);
    await pc.setLocalDescription(await pc.createOffer());
    const resp = await fetch(`/v1/sessions?agent=${encodeURIComponent(agent)}`, {
      method: "POST", headers: { "Content-Type": "application/sdp" }, body: pc.localDescription.sdp,
    });
    if (resp.status !== 201) throw new Error(`POST /v1/sessions: ${resp.status} ${await resp.text()}`);
    t.sid = resp.headers.get("Location").split("/").pop();
    t.answer = await resp.text();
    await pc.setRemoteDescription({ type: "answer", sdp: t.answer });
    await until(() => Object.values(t.chans).every((dc) => dc.readyState === "open"), 20000,
      () => JSON.stringify(Object.fromEntries(Object.entries(t.chans).map(([k, d]) => [k, d.readyState]))));
    return { sid: t.sid, answer: t.answer, offer: pc.localDescription.sdp,
             maxMessageSize: pc.sctp.maxMessageSize,
             ids: Object.fromEntries(Object.entries(t.chans).map(([k, d]) => [k, d.id])) };
  }

  // A message as the test describes it: ["s", text] or ["b", length, seed] (bytes (seed + i) & 255).
  function make(spec) {
    if (spec[0] === "s") return spec[1];
    const a = new Uint8Array(spec[1]);
    for (let i = 0; i < a.length; i++) a[i] = (spec[2] + i) & 255;
    return a.buffer;
  }
  function describe(data) {
    if (typeof data === "string") return ["s", data.length > 64 ? `${data.length}:${data.slice(0, 16)}` : data];
    const a = new Uint8Array(data);
    let sum = 0;
    for (let i = 0; i < a.length; i++) sum = (sum * 31 + a[i]) >>> 0;
    return ["b", a.length, sum];
  }

  // Send `specs` on `label` and resolve with what came back (described), in arrival order.
  async function roundTrip(label, specs, prefix = "") {
    const dc = t.chans[label];
    const start = t.got[label].length;
    const sent = specs.map(make);
    for (const m of sent) dc.send(m);
    await until(() => t.got[label].length >= start + sent.length, 30000,
      () => `${label}: ${t.got[label].length - start} of ${sent.length} came back`);
    const want = sent.map((m) => describe(typeof m === "string" ? prefix + m : m));
    return { want, got: t.got[label].slice(start).map(describe) };
  }

  async function closeLocal(label) {
    t.chans[label].close();
    await until(() => t.closed[label], 10000, () => `${label} is ${t.chans[label].readyState}`);
    return t.chans[label].readyState;
  }

  async function closedByPeer(label, trigger) {
    t.chans[label].send(trigger);
    await until(() => t.closed[label], 10000, () => `${label} is ${t.chans[label].readyState}`);
    return t.chans[label].readyState;
  }

  async function inbound() {
    const stats = await t.pc.getStats();
    for (const s of stats.values()) if (s.type === "inbound-rtp" && s.kind === "audio") return s.packetsReceived;
    return 0;
  }

  return { t, connect, roundTrip, closeLocal, closedByPeer, inbound,
           readyStates: () => Object.fromEntries(Object.entries(t.chans).map(([k, d]) => [k, d.readyState])),
           close: () => t.pc && t.pc.close() };
})();
