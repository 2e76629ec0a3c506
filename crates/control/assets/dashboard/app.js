// rdaq dashboard: reads the live feed (server-sent events over fetch, so that the token can
// go in a header), turns counter differences into rates, and draws tiles, tables, plots,
// the preview and the event log. No framework; plots by the vendored uPlot.
"use strict";

const $ = (id) => document.getElementById(id);
const HISTORY = 600; // points kept in the plots (5 minutes at 2 updates a second)
const EVENTS_SHOWN = 200;

let token = sessionStorage.getItem("rdaq-token") || "";
let prev = null; // the previous snapshot, for rates
let lastPreview = { frame: null, at: 0 };
let stopPath = null;
let startPath = null;
let eventsSeen = 0;
const series = { t: [], fps: [], gbps: [], hitRate: [], spots: [] };

function headers() {
  return token ? { Authorization: "Bearer " + token } : {};
}

function say(text, kind) {
  const m = $("message");
  m.textContent = text;
  m.className = kind || "";
}

function fmt(n, digits) {
  if (n === null || n === undefined || Number.isNaN(n)) return "-";
  if (digits !== undefined) return n.toFixed(digits);
  return Number(n).toLocaleString("en-US");
}

function sum(list, f) {
  return list.reduce((a, x) => a + (f(x) || 0), 0);
}

// ---- the live feed ----

async function connect() {
  for (;;) {
    try {
      const resp = await fetch("/dashboard/live", { headers: headers() });
      if (resp.status === 401 || resp.status === 403) {
        setState(resp.status === 401 ? "token needed" : "wrong token", "lost");
        say("This server protects its reads: enter the API token above.", "bad");
        await waitForToken();
        continue;
      }
      if (!resp.ok) throw new Error(resp.status + " " + resp.statusText);
      await readFeed(resp.body.getReader());
    } catch (e) {
      setState("disconnected", "lost");
    }
    await sleep(1000);
  }
}

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

function waitForToken() {
  return new Promise((resolve) => $("token").addEventListener("change", resolve, { once: true }));
}

async function readFeed(reader) {
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data) update(JSON.parse(data));
    }
  }
}

function update(u) {
  const s = u.snapshot;
  document.title = s.title + " - rdaq";
  $("title").textContent = s.title;
  const lost = s.result && s.result.lost;
  setState(s.state + (lost ? " (data lost)" : ""), lost ? "lost" : s.state);
  $("uptime").textContent = "up " + fmt(s.uptime_s, 0) + " s";
  stopPath = s.stop;
  startPath = s.start;
  $("stop").disabled = !s.stop;
  $("start-controls").hidden = !s.start;
  showTiles(s);
  showReceivers(s.receivers);
  showStages(s);
  showLatency(s.latency);
  showTopology(s.topology);
  showResult(s);
  showPreview(s.preview);
  showEvents(u.events, u.events_dropped);
  prev = s;
}

function setState(text, cls) {
  const b = $("state");
  b.textContent = text;
  b.className = "badge " + (cls || "");
}

// ---- tiles and plots ----

function totals(s) {
  const c = s.receivers.filter((r) => r.counters).map((r) => r.counters);
  return {
    complete: sum(c, (x) => x.frames_complete),
    incomplete: sum(c, (x) => x.frames_incomplete),
    discarded: sum(c, (x) => x.frames_discarded),
    refused: sum(c, (x) => x.frames_refused),
    bytes: sum(c, (x) => x.bytes_placed),
    dropped: sum(c, (x) => x.dropped),
    kernel: sum(c, (x) => x.kernel_drops),
    nacks: sum(c, (x) => x.nacks_sent),
    retransmitted: sum(c, (x) => x.placed_retransmitted),
    recovered: sum(c, (x) => x.frames_recovered),
    slots: sum(c, (x) => x.ring.slots),
    busy: sum(c, (x) => x.ring.filling + x.ring.handed),
  };
}

function showTiles(s) {
  const t = totals(s);
  $("frames-complete").textContent = fmt(t.complete);
  // a run stopped early expects the frames the detector sent
  const finished = s.result && s.result.summary && s.result.summary.frames_expected;
  const expected = finished || s.frames_expected;
  $("frames-expected").textContent = expected ? "of " + fmt(expected) + " expected" : "";
  const lost = t.incomplete + t.discarded + t.refused;
  $("frames-lost").textContent = fmt(lost);
  $("frames-lost-sub").textContent = fmt(t.incomplete) + " incomplete, " + fmt(t.discarded) + " discarded, " + fmt(t.refused) + " refused";
  $("tile-lost").className = "tile" + (lost > 0 ? " bad" : "");
  $("dropped").textContent = fmt(t.dropped);
  $("kernel-drops").textContent = fmt(t.kernel) + " dropped by the kernel";
  $("tile-drops").className = "tile" + (t.dropped + t.kernel > 0 ? " warn" : "");
  $("retransmitted").textContent = fmt(t.retransmitted);
  $("nacks").textContent = fmt(t.nacks) + " requests, " + fmt(t.recovered) + " frames recovered";
  const fill = t.slots ? (100 * t.busy) / t.slots : 0;
  $("ring").textContent = t.slots ? fmt(fill, 0) + " %" : "-";
  $("ring-sub").textContent = fmt(t.busy) + " of " + fmt(t.slots) + " slots in use";
  rates(s, t);
}

function rates(s, t) {
  if (!prev || s.uptime_s <= prev.uptime_s) return;
  const dt = s.uptime_s - prev.uptime_s;
  const p = totals(prev);
  const fps = (t.complete + t.incomplete + t.discarded - (p.complete + p.incomplete + p.discarded)) / dt;
  const gbps = (t.bytes - p.bytes) / dt / 1e9;
  $("fps").textContent = fmt(fps, 1);
  $("gbps").textContent = fmt(gbps, 3) + " GB/s placed";
  let hitRate = null;
  let spots = null;
  if (s.process && prev.process) {
    const frames = s.process.signal_frames - prev.process.signal_frames;
    if (frames > 0) {
      hitRate = (100 * (s.process.hits - prev.process.hits)) / frames;
      spots = (s.process.spots_found - prev.process.spots_found) / frames;
    }
    const all = s.process.signal_frames;
    $("hit-rate").textContent = all ? fmt((100 * s.process.hits) / all, 1) + " %" : "-";
    $("spots-per-frame").textContent = all ? fmt(s.process.spots_found / all, 1) + " spots per frame" : "";
  } else if (!s.process) {
    $("hit-rate").textContent = "-";
    $("spots-per-frame").textContent = "no processing here";
  }
  push(s.uptime_s, fps, gbps, hitRate, spots);
}

function push(t, fps, gbps, hitRate, spots) {
  series.t.push(t);
  series.fps.push(fps);
  series.gbps.push(gbps);
  series.hitRate.push(hitRate);
  series.spots.push(spots);
  for (const k in series) if (series[k].length > HISTORY) series[k].shift();
  plots.rate.setData([series.t, series.fps, series.gbps]);
  plots.hits.setData([series.t, series.hitRate, series.spots]);
}

function makePlot(el, a, b) {
  const width = Math.max(320, el.parentElement.clientWidth - 24);
  return new uPlot(
    {
      width,
      height: 170,
      scales: { x: { time: false } },
      axes: [{ label: "s" }, { scale: "a", label: a.label }, { scale: "b", side: 1, label: b.label, grid: { show: false } }],
      series: [{ label: "time (s)" }, { label: a.label, scale: "a", stroke: "#2563eb", width: 2 }, { label: b.label, scale: "b", stroke: "#d97706", width: 2 }],
    },
    [[], [], []],
    el
  );
}

const plots = {
  rate: makePlot($("plot-rate"), { label: "frames/s" }, { label: "GB/s" }),
  hits: makePlot($("plot-hits"), { label: "hit rate %" }, { label: "spots/frame" }),
};

// ---- tables ----

function rows(tbody, list, cells) {
  tbody.replaceChildren(
    ...list.map((x) => {
      const tr = document.createElement("tr");
      for (const c of cells(x)) {
        const td = document.createElement("td");
        const [text, cls] = Array.isArray(c) ? c : [c, ""];
        td.textContent = text;
        if (cls) td.className = cls;
        tr.appendChild(td);
      }
      return tr;
    })
  );
}

function showReceivers(list) {
  rows($("receivers").tBodies[0], list, (r) => {
    const c = r.counters;
    if (!c) return [r.name, r.alive ? "starting" : ["not answering", "bad"], "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"];
    const bad = (n) => [fmt(n), n > 0 ? "bad" : ""];
    return [
      r.name,
      r.alive ? "answering" : ["not answering", "bad"],
      fmt(c.frames_complete),
      bad(c.frames_incomplete),
      bad(c.frames_discarded),
      bad(c.frames_refused),
      bad(c.dropped),
      bad(c.kernel_drops),
      fmt(c.nacks_sent),
      fmt(c.placed_retransmitted),
      fmt(c.bytes_placed / 1e9, 3),
      fmt(c.ring.filling + c.ring.handed) + " / " + fmt(c.ring.slots),
    ];
  });
  const drops = [];
  for (const r of list) {
    for (const [reason, n] of Object.entries((r.counters && r.counters.dropped_by_reason) || {})) {
      if (n > 0) drops.push([r.name, reason, n]);
    }
  }
  if (!drops.length) drops.push(["-", "none", 0]);
  rows($("drops").tBodies[0], drops, (d) => [d[0], d[1], fmt(d[2])]);
}

// stages in the order frames pass them; the pedestal (dark frames) last
const FLOW = ["gpu", "process", "compress", "write"];
function flow(name) {
  const i = FLOW.indexOf(name);
  return i < 0 ? FLOW.length : i;
}

function showStages(s) {
  const before = new Map(((prev && prev.stages) || []).map((x) => [x.name, x]));
  const dt = prev ? s.uptime_s - prev.uptime_s : 0;
  const list = [...s.stages].sort((a, b) => flow(a.name) - flow(b.name));
  rows($("stages").tBodies[0], list, (st) => {
    const p = before.get(st.name);
    const fps = p && dt > 0 ? (st.frames - p.frames) / dt : null;
    const busy = p && dt > 0 ? (100 * (st.busy_s - p.busy_s)) / dt / st.workers : null;
    return [st.name, st.workers, fmt(st.frames), fmt(fps, 1), busy === null ? "-" : fmt(busy, 0) + " %", fmt(st.queued) + " / " + fmt(st.capacity), fmt(st.blocked), [fmt(st.dropped), st.dropped ? "bad" : ""], fmt(st.discarded)];
  });
  if (!list.length) rows($("stages").tBodies[0], [0], () => ["no processing graph here (frames are written as they arrive)", "", "", "", "", "", "", "", ""]);
}

function us(v) {
  return v >= 1000 ? fmt(v / 1000, 2) + " ms" : fmt(v) + " us";
}

function showLatency(list) {
  rows($("latency").tBodies[0], list.length ? list : [null], (l) => (l ? [l.step, fmt(l.frames), us(l.p50_us), us(l.p99_us), us(l.max_us)] : ["no frames yet", "", "", "", ""]));
}

function showTopology(t) {
  if (!t) return;
  const el = $("topology");
  el.className = "";
  const lines = ["transfer mode: " + t.mode, "detector: " + t.modules + " modules at " + t.detector];
  for (const e of t.epochs || []) lines.push("from frame " + e.from_frame + ": " + e.receivers.join(", ") + " (" + e.reason + "; " + e.dtps + " DTPs)");
  el.textContent = lines.join("\n");
  el.style.whiteSpace = "pre-line";
}

function showResult(s) {
  if (!s.result) return;
  const r = s.result;
  const el = $("result");
  el.className = r.lost ? "bad" : "";
  const x = r.summary || r;
  const parts = [r.lost ? "DATA LOST" : "nothing lost"];
  if (x.frames_expected !== undefined) parts.push(fmt(x.frames_complete) + " of " + fmt(x.frames_expected) + " frames complete");
  else if (x.frames_complete !== undefined) parts.push(fmt(x.frames_complete) + " frames complete, " + fmt(x.frames_written) + " written");
  if (x.stopped_early_of) parts.push("stopped early (" + fmt(x.stopped_early_of) + " asked for)");
  if (x.output) parts.push("file: " + x.output);
  if (x.write_error) parts.push("write error: " + x.write_error);
  el.textContent = parts.join("; ");
}

// ---- preview ----

async function showPreview(p) {
  if (!p) return;
  $("preview-caption").textContent = "frame " + p.frame + ", " + p.width + " x " + p.height + " px, " + p.spots + " spots (" + p.unit + ")";
  const now = Date.now();
  if (p.frame === lastPreview.frame || now - lastPreview.at < 1000) return;
  lastPreview = { frame: p.frame, at: now };
  const resp = await fetch("/dashboard/preview.png?frame=" + p.frame, { headers: headers() });
  if (!resp.ok) return;
  const url = URL.createObjectURL(await resp.blob());
  const img = $("preview");
  img.onload = () => URL.revokeObjectURL(url);
  img.src = url;
}

// ---- events ----

function describe(e) {
  switch (e.type) {
    case "frame_incomplete":
      return ["warn", e.receiver + ": frame " + e.frame + " incomplete, " + e.received + " of " + e.total + " datagrams (" + (e.kept ? "kept, missing pixels masked" : "discarded") + ")"];
    case "packet_loss":
      return ["warn", e.receiver + ": module " + e.module + " sequence " + e.start + ".." + e.end + " missing"];
    case "replanned":
      return ["warn", "re-planned from frame " + e.from_frame + " over " + e.receivers.join(", ") + ": " + e.reason];
    case "error":
      return ["bad", e.source + ": " + e.message];
    case "stop_requested":
      return ["", "stop requested by " + e.by];
    case "source_overflow":
      return ["warn", "module " + e.module + ": " + e.late_frames + " frames started late"];
    case "end_of_transfer":
      return ["", "module " + e.module + " finished: " + e.frames + " frames, " + e.datagrams + " datagrams"];
    default:
      return ["", JSON.stringify(e)];
  }
}

function showEvents(list, dropped) {
  const tbody = $("events").tBodies[0];
  const time = new Date().toLocaleTimeString();
  for (const e of list) {
    eventsSeen++;
    const [cls, text] = describe(e);
    const tr = document.createElement("tr");
    tr.className = cls;
    for (const t of [time, e.type, text]) {
      const td = document.createElement("td");
      td.textContent = t;
      tr.appendChild(td);
    }
    tbody.insertBefore(tr, tbody.firstChild);
  }
  while (tbody.rows.length > EVENTS_SHOWN) tbody.deleteRow(tbody.rows.length - 1);
  $("events-count").textContent = eventsSeen + " seen" + (dropped ? ", " + dropped + " dropped by the server's log before they were read" : "");
}

// ---- control ----

$("token").value = token;
$("token").addEventListener("change", () => {
  token = $("token").value.trim();
  sessionStorage.setItem("rdaq-token", token);
});

// POSTs `body` to `path` with the token; says what came of it.
async function send(path, body, what, done) {
  token = $("token").value.trim();
  const resp = await fetch(path, { method: "POST", headers: { ...headers(), "Content-Type": "application/json" }, body: JSON.stringify(body) });
  let why = "";
  try {
    why = (await resp.json()).error || "";
  } catch (e) {
    why = "";
  }
  if (resp.ok) say(done, "ok");
  else if (resp.status === 401) say("Refused (401): " + what + " needs the API token. " + why, "bad");
  else if (resp.status === 403) say("Refused (403): wrong API token. " + why, "bad");
  else say(what + " failed: " + resp.status + " " + why, "bad");
}

$("stop").addEventListener("click", () => {
  if (stopPath) send(stopPath, {}, "stopping", "Stop sent: the detector stops, the receiver finishes the frames in progress.");
});

$("start").addEventListener("click", () => {
  const output = $("output").value.trim();
  if (startPath) send(startPath, { output: output || null }, "starting", "Started" + (output ? ": writing " + output : ": counting frames, no file") + ".");
});

connect();
