// vnet live view: polls this vnetd's JSON (/api/host every second, /api/overlay every two)
// and draws it. Read-only; no external resources. Rates of this host's ports come from the
// difference of two samples over the daemon's own clock (now_ms); the overlay's rates are
// computed by vnetd from the matrices the hosts publish to etcd.
"use strict";

const HOST_EVERY_MS = 1000;
const OVERLAY_EVERY_MS = 2000;
const HISTORY = 60;

// The token: from the URL's fragment (never sent to the server by the browser), kept for the tab.
(function takeToken() {
  const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (m) {
    sessionStorage.setItem("vnet-token", decodeURIComponent(m[1]));
    window.history.replaceState(null, "", location.pathname);
  }
})();

async function getJSON(path) {
  const headers = {};
  const token = sessionStorage.getItem("vnet-token");
  if (token) headers["Authorization"] = "Bearer " + token;
  const r = await fetch(path, { headers, cache: "no-store" });
  if (r.status === 401) throw new Error("this vnetd needs its token: open /#token=TOKEN");
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

// --- small DOM helpers (text only: names come from configurations and etcd) ---
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    // CSSOM, not a style attribute: the page's CSP refuses inline style attributes.
    if (k === "class") e.className = v; else if (k === "background") e.style.background = v; else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}
const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
const $ = (id) => document.getElementById(id);

function fmtBits(bytesPerS) {
  const b = bytesPerS * 8;
  if (!isFinite(b) || b <= 0) return "0";
  const units = ["bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s"];
  let i = 0, v = b;
  while (v >= 1000 && i < units.length - 1) { v /= 1000; i++; }
  return (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)) + " " + units[i];
}
function fmtRate(perS) {
  if (!isFinite(perS) || perS <= 0) return "0";
  if (perS >= 1e6) return (perS / 1e6).toFixed(1) + "M";
  if (perS >= 1e3) return (perS / 1e3).toFixed(1) + "k";
  return perS.toFixed(perS >= 10 ? 0 : 1);
}
function setStatus(text, ok) {
  const s = $("status");
  s.textContent = text;
  s.className = "status " + (ok ? "ok" : "bad");
}

// --- this host ---
const prevPorts = new Map();   // key -> {t, rx_bytes, tx_bytes, rx_frames, tx_frames, drops}
const portHistory = new Map(); // key -> [bytes/s in+out]
let prevMatrix = null;         // {t, map key -> bytes}

function sumDrops(d) { return Object.values(d || {}).reduce((a, b) => a + b, 0); }

function sparkline(values) {
  const w = 120, h = 22;
  const s = svg("svg", { width: w, height: h, class: "spark", viewBox: `0 0 ${w} ${h}` });
  const max = Math.max(1, ...values);
  // The newest sample at the right edge; the line grows leftwards over the first minute.
  const step = (w - 2) / Math.max(1, HISTORY - 1);
  const pts = values.map((v, i) => `${w - 1 - (values.length - 1 - i) * step},${h - 2 - (v / max) * (h - 4)}`);
  s.append(svg("polyline", { points: pts.join(" "), fill: "none", stroke: "#1f6feb", "stroke-width": 1.5 }));
  return s;
}

function renderPorts(data) {
  const tbody = $("ports").querySelector("tbody");
  const linkState = new Map(data.links.map((l) => [l.name, l]));
  const rows = [];
  for (const p of data.stats.ports) {
    const key = p.kind + ":" + p.name;
    const prev = prevPorts.get(key);
    const dt = prev ? (data.now_ms - prev.t) / 1000 : 0;
    const rate = (f) => (prev && dt > 0 ? Math.max(0, (p[f] - prev[f]) / dt) : 0);
    const inB = rate("rx_bytes"), outB = rate("tx_bytes");
    const dropsNow = sumDrops(p.drops);
    const dropRate = prev && dt > 0 ? Math.max(0, (dropsNow - prev.drops) / dt) : 0;
    prevPorts.set(key, { t: data.now_ms, rx_bytes: p.rx_bytes, tx_bytes: p.tx_bytes,
      rx_frames: p.rx_frames, tx_frames: p.tx_frames, drops: dropsNow });
    const h = portHistory.get(key) || [];
    if (prev) h.push(inB + outB);
    while (h.length > HISTORY) h.shift();
    portHistory.set(key, h);
    const l = p.kind === "link" ? linkState.get(p.name) : null;
    const state = l ? l.state + (l.encrypted ? " (encrypted)" : "") : "";
    const drops = Object.entries(p.drops || {}).map(([r, n]) => r + " " + n).join(", ") || "-";
    rows.push(el("tr", { "data-port": key },
      el("td", {}, p.kind + (p.path === "kernel" ? " (kernel)" : "")), el("td", { class: "mono" }, p.name), el("td", {}, p.vni),
      el("td", { class: l ? "state-" + l.state : "" }, state),
      el("td", { class: "num in", "data-rate": inB.toFixed(1) }, fmtBits(inB)),
      el("td", { class: "num out", "data-rate": outB.toFixed(1) }, fmtBits(outB)),
      el("td", { class: "num" }, fmtRate(rate("rx_frames")) + " / " + fmtRate(rate("tx_frames"))),
      el("td", { class: "num", "data-rate": dropRate.toFixed(1) }, fmtRate(dropRate)),
      el("td", { class: "drops" }, drops),
      el("td", {}, sparkline(h))));
  }
  tbody.replaceChildren(...rows);
}

function kv(pairs) {
  const dl = el("dl", { class: "kv" });
  for (const [k, v] of pairs) dl.append(el("dt", {}, k), el("dd", {}, v));
  return dl;
}

function renderDatapath(data) {
  const d = data.stats.dispatch, s = d.settings;
  const pairs = [["mode", `${s.mode} (${s.dispatchers} dispatcher${s.dispatchers > 1 ? "s" : ""}, yield ${s.yield})`]];
  for (const x of d.dispatchers) {
    pairs.push([`dispatcher ${x.index}`, `${x.mode}, ${x.frames_per_wakeup} frames per wake-up, ${x.switches} switches`]);
  }
  pairs.push(["offload", `UDP GSO ${d.udp_gso ? "on" : "off"}, GRO ${d.udp_gro ? "on" : "off"}`]);
  pairs.push(["UDP socket", `${data.stats.daemon.rx_datagrams} datagrams received, ${sumDrops(data.stats.daemon.drops)} dropped before a link was known`]);
  $("datapath").replaceChildren(kv(pairs));
}

function renderAgent(data) {
  const a = data.agent;
  $("agent-card").hidden = !a;
  if (!a) return;
  const pairs = [
    ["overlay / host", `${a.overlay} / ${a.host_id}`],
    ["etcd", (a.connected ? "connected" : "not connected") + (data.synced ? ", synced" : "")],
    ["revision", String(a.revision)],
    ["hosts, interfaces", `${a.hosts}, ${a.interfaces}`],
    ["last sync", a.last_sync_age === null ? "never" : a.last_sync_age.toFixed(1) + " s ago"],
    ["conflicts", a.conflicts.length ? a.conflicts.join("; ") : "none"],
  ];
  if (a.last_error) pairs.push(["last error", a.last_error]);
  $("agent").replaceChildren(kv(pairs));
  $("hostline").textContent = `host ${a.host_id} in overlay ${a.overlay}`;
}

// --- heat maps ---
function heatColor(v, max) {
  if (!(v > 0) || !(max > 0)) return "#eef1f5";
  const x = Math.min(1, Math.log10(1 + v) / Math.log10(1 + max));
  // light yellow -> orange -> deep red
  const hue = 50 - 50 * x, light = 88 - 48 * x;
  return `hsl(${hue.toFixed(0)}, 90%, ${light.toFixed(0)}%)`;
}

function heatmap(target, labels, cells, note) {
  if (!labels.length) {
    target.replaceChildren(el("p", { class: "note" }, "no traffic seen yet"));
    return;
  }
  const max = Math.max(0, ...cells.map((c) => c.rate));
  const grid = new Map(cells.map((c) => [c.src + "," + c.dst, c.rate]));
  const head = el("tr", {}, el("th", {}, "from \\ to"), ...labels.map((l) => el("th", { class: "col" }, l)));
  const rows = labels.map((l, i) => el("tr", {}, el("th", {}, l), ...labels.map((_, j) => {
    const v = grid.get(i + "," + j) || 0;
    return el("td", { background: heatColor(v, max), title: `${l} -> ${labels[j]}: ${fmtBits(v)}`,
      "data-pair": `${l}>${labels[j]}`, "data-rate": v.toFixed(1) });
  })));
  target.replaceChildren(el("table", {}, head, ...rows));
  if (note) note.textContent = max > 0 ? `darkest: ${fmtBits(max)}` : "no traffic in the last interval";
}

function renderLocalMatrix(data, overlayShown) {
  $("local-heat-card").hidden = overlayShown;
  if (overlayShown) return;
  const now = data.now_ms;
  const cur = new Map(data.matrix.pairs.map((p) => [`${p.vni}|${p.src}|${p.dst}`, p.bytes]));
  const macs = [];
  const idx = new Map();
  const index = (vni, mac) => {
    const k = vni + "|" + mac;
    if (!idx.has(k)) { idx.set(k, macs.length); macs.push(`${mac}${vni !== 1 ? " v" + vni : ""}`); }
    return idx.get(k);
  };
  const cells = [];
  for (const p of data.matrix.pairs) {
    if (macs.length > 40) break;
    const k = `${p.vni}|${p.src}|${p.dst}`;
    const before = prevMatrix ? prevMatrix.map.get(k) : undefined;
    const dt = prevMatrix ? (now - prevMatrix.t) / 1000 : 0;
    const rate = before !== undefined && dt > 0 ? Math.max(0, (p.bytes - before) / dt) : 0;
    cells.push({ src: index(p.vni, p.src), dst: index(p.vni, p.dst), rate });
  }
  prevMatrix = { t: now, map: cur };
  heatmap($("local-heatmap"), macs, cells, $("local-heat-note"));
}

let overlayShown = false;

async function pollHost() {
  try {
    const data = await getJSON("api/host");
    $("version").textContent = data.version;
    renderPorts(data);
    renderDatapath(data);
    renderAgent(data);
    renderLocalMatrix(data, overlayShown);
    setStatus("live " + new Date().toLocaleTimeString(), true);
  } catch (e) {
    setStatus(e.message, false);
  }
}

// --- the overlay ---
function renderGraph(o) {
  const g = $("graph");
  const W = 640, H = 430, cx = W / 2, cy = H / 2 + 5, r = Math.min(W, H) / 2 - 70;
  const pos = new Map();
  o.hosts.forEach((h, i) => {
    const a = -Math.PI / 2 + (2 * Math.PI * i) / Math.max(1, o.hosts.length);
    pos.set(h.id, [cx + r * Math.cos(a), cy + r * Math.sin(a)]);
  });
  const maxRate = Math.max(1, ...o.edges.map((e) => e.a_to_b_bytes_per_s + e.b_to_a_bytes_per_s));
  const parts = [];
  for (const e of o.edges) {
    const p = pos.get(e.a), q = pos.get(e.b);
    if (!p || !q) continue;
    const rate = e.a_to_b_bytes_per_s + e.b_to_a_bytes_per_s;
    const w = 1.5 + (rate > 0 ? 9 * Math.log10(1 + rate) / Math.log10(1 + maxRate) : 0);
    parts.push(svg("line", { x1: p[0], y1: p[1], x2: q[0], y2: q[1], stroke: rate > 0 ? "#f97316" : "#94a3b8",
      "stroke-width": w.toFixed(1), "stroke-dasharray": e.linked ? "" : "6 5", "stroke-linecap": "round",
      "data-edge": e.a + "-" + e.b, "data-rate": rate.toFixed(1) }));
    const mx = (p[0] + q[0]) / 2, my = (p[1] + q[1]) / 2;
    parts.push(svg("text", { x: mx, y: my - 6, "text-anchor": "middle", "font-size": 12, fill: "#1d2733",
      class: "edge-label", "data-edge": e.a + "-" + e.b, "data-rate": rate.toFixed(1) },
      rate > 0 ? fmtBits(rate) : (e.linked ? "idle" : "")));
  }
  const perHost = o.guests_per_host || {};
  for (const h of o.hosts) {
    const [x, y] = pos.get(h.id);
    const grp = svg("g", { "data-host": h.id });
    grp.append(svg("circle", { cx: x, cy: y, r: 34, fill: h.local ? "#ede9fe" : "#e0ecff",
      stroke: h.local ? "#7c3aed" : "#1f6feb", "stroke-width": h.local ? 3 : 2 }));
    grp.append(svg("text", { x, y: y - 4, "text-anchor": "middle", "font-size": 15, "font-weight": 700 }, h.id));
    grp.append(svg("text", { x, y: y + 12, "text-anchor": "middle", "font-size": 10, fill: "#475569" }, h.addr));
    const n = (perHost[h.id] || []).length;
    grp.append(svg("text", { x, y: y + 50, "text-anchor": "middle", "font-size": 11, fill: "#475569" },
      `${n} guest${n === 1 ? "" : "s"}${h.encrypted ? " · encrypted" : ""}`));
    parts.push(grp);
  }
  g.replaceChildren(...parts);
  const busy = o.edges.filter((e) => e.a_to_b_bytes_per_s + e.b_to_a_bytes_per_s > 0).length;
  $("graph-note").textContent = `${o.hosts.length} hosts, ${o.edges.filter((e) => e.linked).length} links` +
    ` (${busy} carrying traffic); line width: rate; dashed: traffic relayed without a direct link.` +
    (o.matrices_error ? " Matrices unreadable: " + o.matrices_error : "");
}

function renderOverlay(o) {
  $("overlay-section").hidden = false;
  $("overlay-name").textContent = o.overlay;
  $("overlay-policy").textContent = "(" + o.policy + ")";
  renderGraph(o);
  const labels = o.guests.map((g) => `${g.host}/${g.name}`);
  const cells = o.matrix.map((c) => ({ src: c.src, dst: c.dst, rate: c.bytes_per_s }));
  heatmap($("heatmap"), labels, cells, $("heat-note"));
  if (o.guests_not_shown) $("heat-note").textContent += ` (${o.guests_not_shown} quieter guests not shown)`;
  const boxes = [];
  for (const h of o.hosts) {
    const list = (o.guests_per_host[h.id] || []).map((g) =>
      el("li", {}, el("span", { class: "mono" }, g.mac), " " + g.name + (g.vni !== 1 ? ` (VNI ${g.vni})` : "")));
    boxes.push(el("div", { class: "host" + (h.local ? " local" : ""), "data-host": h.id },
      el("b", {}, h.id + (h.local ? " (this host)" : "")), el("ul", {}, ...list)));
  }
  $("guests").replaceChildren(...boxes);
}

async function pollOverlay() {
  try {
    const o = await getJSON("api/overlay");
    overlayShown = !!(o.enabled && o.hosts);
    if (overlayShown) renderOverlay(o);
    return o.enabled;
  } catch (e) {
    setStatus(e.message, false);
    return true;
  }
}

(async function main() {
  await pollHost();
  setInterval(pollHost, HOST_EVERY_MS);
  if (await pollOverlay()) setInterval(pollOverlay, OVERLAY_EVERY_MS);
})();
