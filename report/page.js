// Draws the report from the JSON in #report-data (see doc.go). After each
// chart it records what it drew in data-drawn-* attributes, which the
// browser test reads back; at the end it sets body's data-rendered.
"use strict";
window.addEventListener("error", () => {
  document.body.dataset.errors = String(Number(document.body.dataset.errors || 0) + 1);
});

const D = JSON.parse(document.getElementById("report-data").textContent);
const SVGNS = "http://www.w3.org/2000/svg"; // a namespace name, not a fetch
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
const LIVE = "#9ca3af";
const MAP_COLORS = { used: "#2563eb", rounding: "#f59e0b", split: "#ef4444", cached: "#cbd5e1" };
const GiB = 1024 * 1024 * 1024;
const tip = document.getElementById("tip");

function color(i) { return COLORS[i % COLORS.length]; }

function el(tag, attrs, parent) {
  const e = document.createElementNS(SVGNS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}

function html(tag, attrs, parent, text) {
  const e = document.createElement(tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}

// size formats bytes in GiB, or MiB/KiB/B when small.
function size(b) {
  if (b >= GiB / 4) return (b / GiB).toFixed(b >= 100 * GiB ? 1 : 3) + " GiB";
  if (b >= 1024 * 1024) return (b / 1024 / 1024).toFixed(1) + " MiB";
  if (b >= 1024) return (b / 1024).toFixed(1) + " KiB";
  return b + " B";
}

function secs(us) {
  const s = us / 1e6;
  return (s >= 100 ? s.toFixed(1) : s >= 1 ? s.toFixed(2) : s.toFixed(3)) + " s";
}

function pct(x) { return (100 * x).toFixed(1) + "%"; }

// nice returns about n round tick values from 0 to max.
function ticks(max, n) {
  if (!(max > 0)) return [0];
  const raw = max / n;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(s => s >= raw);
  const out = [];
  for (let v = 0; v <= max * 1.0000001; v += step) out.push(v);
  return out;
}

function showTip(ev, text) {
  tip.textContent = text;
  tip.hidden = false;
  const w = tip.offsetWidth, h = tip.offsetHeight;
  let x = ev.clientX + 14, y = ev.clientY + 14;
  if (x + w > window.innerWidth - 4) x = ev.clientX - w - 14;
  if (y + h > window.innerHeight - 4) y = ev.clientY - h - 14;
  tip.style.left = x + "px";
  tip.style.top = y + "px";
}

function hideTip() { tip.hidden = true; }

const C = D.clock;
const SPAN_US = C.n * C.width_us; // the time axis, from the first event
// bucketTime is the time (us from the first event) of bucket i's middle.
function bucketTime(i) { return (i + 0.5) * C.width_us; }

// chart draws series over time in an SVG inside parent.
//   opt.series: [{name, color, min, max, line (optional, else max), fill}]
//   opt.yMax, opt.yFmt (tick label), opt.yUnit, opt.markers: [{t, v, color, label}]
//   opt.points: [{name, color, pts: [[t_us, v], ...]}] (drawn as lines, not bucketed)
// It returns the svg, with data-drawn-max (greatest value plotted per series).
function chart(parent, opt) {
  const W = opt.width || 640, H = opt.height || 230;
  const m = { l: 58, r: 14, t: 10, b: 34 };
  const iw = W - m.l - m.r, ih = H - m.t - m.b;
  const box = html("div", { class: "chart" + (opt.wide ? " wide" : "") }, parent);
  if (opt.title) html("h3", {}, box, opt.title);
  const legend = html("div", { class: "legend" }, box);
  const svg = el("svg", { id: opt.id, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": opt.title || "" }, box);
  const x = t => m.l + (SPAN_US > 0 ? t / SPAN_US : 0) * iw;
  const y = v => m.t + ih - (opt.yMax > 0 ? Math.min(v / opt.yMax, 1.02) : 0) * ih;

  // Axes and grid.
  const ax = el("g", { class: "axis" }, svg);
  const unit = opt.yTickUnit || 1; // ticks are round in this unit
  for (const v of ticks(opt.yMax / unit, 5).map(u => u * unit)) {
    el("line", { class: "gridline", x1: m.l, x2: m.l + iw, y1: y(v), y2: y(v) }, ax);
    el("text", { x: m.l - 6, y: y(v) + 4, "text-anchor": "end" }, ax).textContent = opt.yFmt(v);
  }
  for (const s of ticks(SPAN_US / 1e6, 8)) {
    el("line", { x1: x(s * 1e6), x2: x(s * 1e6), y1: m.t + ih, y2: m.t + ih + 4 }, ax);
    el("text", { x: x(s * 1e6), y: m.t + ih + 16, "text-anchor": "middle" }, ax).textContent = +s.toFixed(6);
  }
  el("line", { x1: m.l, x2: m.l + iw, y1: m.t + ih, y2: m.t + ih }, ax);
  el("line", { x1: m.l, x2: m.l, y1: m.t, y2: m.t + ih }, ax);
  el("text", { x: m.l + iw, y: H - 3, "text-anchor": "end" }, ax).textContent = "seconds";
  el("text", { x: 12, y: m.t + ih / 2, "text-anchor": "middle", transform: `rotate(-90 12 ${m.t + ih / 2})` }, ax).textContent = opt.yUnit;

  const drawn = {};
  for (const s of opt.series) {
    const g = el("g", { class: "series", "data-chart": opt.id, "data-series": s.key || s.name }, svg);
    let top = "", bottom = "", line = "", most = -Infinity, n = 0;
    for (let i = 0; i < s.max.length; i++) {
      if (s.max[i] < 0) continue; // undefined here (no memory reserved)
      const px = x(bucketTime(i)).toFixed(1);
      top += (top ? "L" : "M") + px + "," + y(s.max[i]).toFixed(1);
      bottom = "L" + px + "," + y(s.min[i]).toFixed(1) + bottom;
      const lv = s.line ? s.line[i] : s.max[i];
      line += (line ? "L" : "M") + px + "," + y(lv).toFixed(1);
      most = Math.max(most, s.max[i]);
      n++;
    }
    if (s.fill !== false && top) el("path", { d: top + bottom + "Z", fill: s.color, "fill-opacity": s.fillOpacity || 0.18, stroke: "none" }, g);
    if (line) el("path", { d: line, fill: "none", stroke: s.color, "stroke-width": s.width || 1.4, "stroke-linejoin": "round" }, g);
    g.dataset.drawnMax = String(most);
    g.dataset.points = String(n);
    drawn[s.key || s.name] = most;
    const item = html("span", {}, legend);
    html("span", { class: "swatch", style: `background:${s.color}` }, item);
    item.appendChild(document.createTextNode(s.name));
  }
  for (const p of opt.points || []) {
    const g = el("g", { class: "series", "data-chart": opt.id, "data-series": p.name }, svg);
    let line = "", most = -Infinity;
    for (const [t, v] of p.pts) {
      if (v < 0) continue;
      line += (line ? "L" : "M") + x(t).toFixed(1) + "," + y(v).toFixed(1);
      most = Math.max(most, v);
    }
    if (line) el("path", { d: line, fill: "none", stroke: p.color, "stroke-width": 1.4 }, g);
    g.dataset.drawnMax = String(most);
    g.dataset.points = String(p.pts.length);
    const item = html("span", {}, legend);
    html("span", { class: "swatch", style: `background:${p.color}` }, item);
    item.appendChild(document.createTextNode(p.name));
  }
  for (const mk of opt.markers || []) {
    const cx = x(mk.t), cy = y(mk.v);
    const c = el("circle", { class: "peak", cx, cy, r: 4, fill: "#fff", stroke: mk.color, "stroke-width": 2, "data-chart": opt.id, "data-series": mk.series, "data-bytes": mk.v, "data-t-us": mk.t }, svg);
    el("title", {}, c).textContent = mk.label;
    if (mk.text) {
      const right = cx > m.l + iw * 0.7;
      el("text", { class: "peak-label", x: cx + (right ? -7 : 7), y: Math.max(cy - 6, m.t + 9), "text-anchor": right ? "end" : "start", fill: mk.color }, svg).textContent = mk.label;
    }
  }

  // Hover: a cursor and the values of the bucket under it.
  const cursor = el("line", { x1: 0, x2: 0, y1: m.t, y2: m.t + ih, stroke: "#374151", "stroke-dasharray": "3,3", visibility: "hidden" }, svg);
  svg.addEventListener("mousemove", ev => {
    const r = svg.getBoundingClientRect();
    const px = (ev.clientX - r.left) * W / r.width;
    if (px < m.l || px > m.l + iw) { cursor.setAttribute("visibility", "hidden"); hideTip(); return; }
    const i = Math.min(C.n - 1, Math.max(0, Math.floor((px - m.l) / iw * C.n)));
    cursor.setAttribute("x1", x(bucketTime(i)));
    cursor.setAttribute("x2", x(bucketTime(i)));
    cursor.setAttribute("visibility", "visible");
    const t0 = i * C.width_us;
    const lines = [`${secs(t0)} to ${secs(t0 + C.width_us)}`];
    for (const s of opt.series) {
      if (s.max[i] < 0) { lines.push(`${s.name}: none reserved`); continue; }
      const mid = s.line ? ` (mean ${opt.tipFmt(s.line[i])})` : "";
      lines.push(s.min[i] === s.max[i] ? `${s.name}: ${opt.tipFmt(s.max[i])}` : `${s.name}: ${opt.tipFmt(s.min[i])} to ${opt.tipFmt(s.max[i])}${mid}`);
    }
    for (const p of opt.points || []) {
      const t = (i + 1) * C.width_us;
      let best = null;
      for (const q of p.pts) if (best === null || Math.abs(q[0] - t) < Math.abs(best[0] - t)) best = q;
      if (best && best[1] >= 0) lines.push(`${p.name}: ${opt.tipFmt(best[1])} at ${secs(best[0])}`);
    }
    showTip(ev, lines.join("\n"));
  });
  svg.addEventListener("mouseleave", () => { cursor.setAttribute("visibility", "hidden"); hideTip(); });
  svg.dataset.drawnMax = String(Math.max(...Object.values(drawn)));
  svg.dataset.points = String(C.n);
  return svg;
}

// The overview shares one scale, up to the peaks of the policies that hold
// at most OUTLIER times the program's peak; a policy above (one that takes
// most of the device at start) runs off the top, its peak labelled, and its
// own chart has its own scale.
const OUTLIER = 4;

function memoryCharts() {
  const live0 = D.peak_live.bytes;
  const within = D.policies.filter(p => p.peak_reserved.bytes <= OUTLIER * live0);
  const shared = Math.max(live0, ...within.map(p => p.peak_reserved.bytes)) * 1.06;
  const live = { name: "live", color: LIVE, min: D.live.min, max: D.live.max, fillOpacity: 0.35 };
  const liveMark = { t: D.peak_live.t_us - C.t0_us, v: live0, color: "#4b5563", series: "live",
    label: `live peak ${size(live0)} at ${secs(D.peak_live.t_us - C.t0_us)}` };
  const common = yMax => ({ yMax, yTickUnit: GiB, yFmt: v => String(+(v / GiB).toFixed(3)), tipFmt: size, yUnit: "GiB" });
  const off = p => p.peak_reserved.bytes > shared;
  chart(document.getElementById("overview"), Object.assign(common(shared), {
    id: "chart-all", title: "All policies" + (D.policies.some(off) ? " (policies above the scale are drawn at its top)" : ""), width: 1300, height: 300, wide: true,
    series: [live].concat(D.policies.map((p, i) => ({ name: p.name + (off(p) ? ` (${size(p.peak_reserved.bytes)}, above the scale)` : ""),
      key: p.name, color: color(i), min: p.reserved.min, max: p.reserved.max, fillOpacity: 0.08 }))),
    markers: [liveMark].concat(D.policies.map((p, i) => ({ t: p.peak_reserved.t_us - C.t0_us, v: p.peak_reserved.bytes, color: color(i), series: p.name,
      label: `${p.name} ${size(p.peak_reserved.bytes)}`, text: off(p) }))),
  }));
  const grid = document.getElementById("per-policy");
  D.policies.forEach((p, i) => {
    const svg = chart(grid, Object.assign(common(off(p) ? p.peak_reserved.bytes * 1.06 : shared), {
      id: "chart-policy-" + i, title: `${p.name}: peak ${size(p.peak_reserved.bytes)}, ratio ${p.ratio.toFixed(3)}` + (p.ooms ? `, ${p.ooms} OOMs` : "") + (off(p) ? " (its own scale)" : ""),
      series: [live, { name: p.name + " reserved", color: color(i), min: p.reserved.min, max: p.reserved.max }],
      markers: [liveMark, { t: p.peak_reserved.t_us - C.t0_us, v: p.peak_reserved.bytes, color: color(i), series: p.name, text: true,
        label: `peak ${size(p.peak_reserved.bytes)} at ${secs(p.peak_reserved.t_us - C.t0_us)}` }],
    }));
    svg.dataset.policy = p.name;
    svg.classList.add("policy-chart");
  });
}

function fragCharts() {
  const fmt = v => (100 * v).toFixed(0) + "%";
  chart(document.getElementById("frag"), {
    id: "chart-frag", title: "Reserved but not live", yMax: 1, yFmt: fmt, tipFmt: pct, yUnit: "share of reserved",
    series: D.policies.map((p, i) => ({ name: p.name, color: color(i), min: p.frag.min, max: p.frag.max, line: p.frag.mean, fillOpacity: 0.1 })),
  });
  chart(document.getElementById("free"), {
    id: "chart-free", title: "Free memory outside the largest free block", yMax: 1, yFmt: fmt, tipFmt: pct, yUnit: "share of free",
    series: [],
    points: D.policies.map((p, i) => ({ name: p.name, color: color(i),
      pts: p.free.map(s => [s.t_us - C.t0_us, s.bytes > 0 ? 1 - s.largest / s.bytes : -1]) })),
  });
}

// maps draws each policy's segments at its peak on a canvas: the bytes in
// rows, left to right, and a bar of the four parts.
function maps() {
  const root = document.getElementById("maps");
  const kinds = [["used", "used"], ["rounding", "rounding"], ["split", "split (free, in a segment with live blocks)"], ["cached", "cached (free segments)"]];
  D.policies.forEach((p, pi) => {
    const m = p.map;
    const box = html("div", { class: "map", "data-policy": p.name }, root);
    html("h3", {}, box, `${p.name}: ${size(m.reserved)} in ${m.segments.length} segments at ${secs(p.peak_reserved.t_us - C.t0_us)}`);
    const cssW = Math.min(1300, root.clientWidth || 1300), rows = 18, rowH = 12, gap = 3;
    const bar = html("div", { class: "bar", style: `width:${cssW}px` }, box);
    const legend = html("div", { class: "legend" }, box);
    for (const [k, label] of kinds) {
      const share = m.reserved > 0 ? m[k] / m.reserved : 0;
      html("span", { style: `width:${100 * share}%;background:${MAP_COLORS[k]}`, title: `${label}: ${size(m[k])}` }, bar);
      const item = html("span", {}, legend);
      html("span", { class: "swatch", style: `background:${MAP_COLORS[k]}` }, item);
      item.appendChild(document.createTextNode(`${label}: ${size(m[k])} (${pct(share)})`));
    }

    const cssH = rows * (rowH + gap);
    const dpr = window.devicePixelRatio || 1;
    const cv = html("canvas", { id: "map-" + pi, "data-policy": p.name, width: Math.round(cssW * dpr), height: Math.round(cssH * dpr) }, box);
    cv.style.width = cssW + "px";
    cv.style.height = cssH + "px";
    const g = cv.getContext("2d");
    g.scale(dpr, dpr);
    const perRow = m.reserved / rows || 1;
    const bpx = perRow / cssW; // bytes per pixel
    // span fills bytes [a, b) of the map, across rows.
    const span = (a, b, fill) => {
      g.fillStyle = fill;
      for (let r = Math.min(rows - 1, Math.floor(a / perRow)); a < b && r < rows; r++) {
        const rowEnd = r === rows - 1 ? Infinity : (r + 1) * perRow;
        if (rowEnd <= a) continue; // a sits at the row's end (rounding)
        const end = Math.min(b, rowEnd);
        g.fillRect((a - r * perRow) / bpx, r * (rowH + gap), Math.max((end - a) / bpx, 0.35), rowH);
        a = end;
      }
    };
    const starts = [];
    let at = 0, drawn = 0, blocks = 0;
    for (const s of m.segments) {
      starts.push(at);
      const live = s.blocks.some((v, k) => k % 2 === 1 && v > 0);
      for (let k = 0; k < s.blocks.length; k += 2) {
        const bs = s.blocks[k], req = s.blocks[k + 1];
        if (req > 0) {
          span(at, at + req, MAP_COLORS.used);
          span(at + req, at + bs, MAP_COLORS.rounding);
        } else {
          span(at, at + bs, live ? MAP_COLORS.split : MAP_COLORS.cached);
        }
        at += bs;
        drawn += bs;
        blocks++;
      }
    }
    g.fillStyle = "#111827";
    for (const a of starts) {
      const r = Math.min(rows - 1, Math.floor(a / perRow));
      g.fillRect((a - r * perRow) / bpx, r * (rowH + gap) - 1, 1, rowH + 2);
    }
    cv.dataset.drawnBytes = String(drawn);
    cv.dataset.segments = String(m.segments.length);
    cv.dataset.blocks = String(blocks);

    cv.addEventListener("mousemove", ev => {
      const r = cv.getBoundingClientRect();
      const px = ev.clientX - r.left, py = ev.clientY - r.top;
      const row = Math.floor(py / (rowH + gap));
      if (row < 0 || row >= rows) { hideTip(); return; }
      const b = row * perRow + px * bpx;
      let lo = 0, hi = starts.length - 1;
      while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (starts[mid] <= b) lo = mid; else hi = mid - 1; }
      const s = m.segments[lo];
      if (!s) { hideTip(); return; }
      let off = starts[lo], text = `segment ${s.addr}: ${size(s.size)}, stream ${s.stream}, ${s.blocks.length / 2} blocks`;
      for (let k = 0; k < s.blocks.length; k += 2) {
        if (b < off + s.blocks[k]) {
          const req = s.blocks[k + 1];
          text += `\nblock at +${size(off - starts[lo])}: ${size(s.blocks[k])}, ` + (req > 0 ? `live, ${size(req)} asked` : "free");
          break;
        }
        off += s.blocks[k];
      }
      showTip(ev, text);
    });
    cv.addEventListener("mouseleave", hideTip);
  });
}

function siteCell(tr, site) {
  const td = html("td", { class: "site" }, tr);
  if (!site) { td.textContent = "—"; return; }
  const text = D.sites[site] || "";
  const frames = text.split(" < ");
  if (frames.length === 1) { td.textContent = text; return; }
  const det = html("details", {}, td);
  html("summary", {}, det, frames[0]);
  html("div", { class: "more" }, det, frames.slice(1).map(f => "< " + f).join("\n"));
}

function tables() {
  const body = document.querySelector("#largest tbody");
  D.largest.forEach((r, i) => {
    const tr = html("tr", { "data-size": r.size }, body);
    html("td", { class: "num" }, tr, String(i + 1));
    html("td", { class: "num" }, tr, size(r.size));
    html("td", { class: "num" }, tr, String(r.id) + (D.streams > 1 ? ` (stream ${r.stream})` : ""));
    html("td", { class: "num" }, tr, secs(r.t_us - C.t0_us));
    html("td", { class: "num" }, tr, r.free_us < 0 ? "never" : secs(r.free_us - C.t0_us));
    html("td", { class: "num" }, tr, r.free_us < 0 ? "to the end" : secs(r.free_us - r.t_us));
    siteCell(tr, r.site);
  });
  const sites = document.querySelector("#sites tbody");
  if (D.at_peak.length === 0) {
    document.getElementById("sites-section").hidden = true;
    return;
  }
  D.at_peak.forEach((s, i) => {
    const tr = html("tr", { "data-bytes": s.bytes }, sites);
    html("td", { class: "num" }, tr, String(i + 1));
    html("td", { class: "num" }, tr, size(s.bytes));
    html("td", { class: "num" }, tr, pct(s.bytes / D.peak_live.bytes));
    html("td", { class: "num" }, tr, String(s.requests));
    if (s.site) siteCell(tr, s.site); else html("td", { class: "site" }, tr, "(no call site recorded)");
  });
}

memoryCharts();
fragCharts();
maps();
tables();
document.body.dataset.rendered = "ok";
