// The live view: frames from GET /v1/stats/stream (read with fetch, so the key goes in a
// header) drawn as cards, the expert heatmap, two charts, the memory plan and the requests.
import { errorMessage, readEvents } from "/ui/api.js";

const $ = (id) => document.getElementById(id);
const HISTORY = 120;  // frames kept for the charts (a minute at the default interval)
const COLORS = { 0: "#1b2233", 1: "#4c6aa8", 2: "#3fbf6f", 3: "#e8823d", 4: "#a371f7" };
const SERIES = { hit: "#3fbf6f", mpt: "#e8823d", dec: "#4c8df6", pre: "#a371f7" };

const fmt = {
  rate: (x) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2)),
  pct: (x) => (100 * x).toFixed(1) + "%",
  bytes(n) {
    if (n == null) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(n >= 100 ? 0 : 1) : n.toFixed(0)) + " " + units[i];
  },
};

export class LiveView {
  constructor(api) {
    this.api = api;
    this.history = [];  // {hit, mpt, dec, pre} per frame
    this.previous = null;  // the last frame's expert counters
    this.cells = null;  // the last expert map drawn
    this.frames = 0;
    this.mapVersion = 0;  // bumps whenever the heatmap is redrawn from a new map
    this.modelName = null;
  }

  async start() {
    for (;;) {
      try {
        const response = await this.api.fetch("/v1/stats/stream?interval=0.5&experts=true");
        if (!response.ok) throw new Error(await errorMessage(response));
        this.status("live");
        await readEvents(response, (data) => this.update(JSON.parse(data)));
        this.status("closed");
      } catch (err) {
        this.status("offline", err.message);
      }
      await new Promise((r) => setTimeout(r, 2000));
    }
  }

  status(state, why) {
    const node = $("conn");
    node.dataset.state = state;
    node.title = why ? state + ": " + why : state;
  }

  update(frame) {
    this.frames++;
    this.lastInterval = frame.rates.seconds;
    const stats = frame.stats;
    if (stats.model && stats.model !== this.modelName) {
      this.modelName = stats.model;
      $("model").textContent = stats.model;
    }
    const engine = stats.engine;
    const point = this.point(frame, engine);
    this.history.push(point);
    if (this.history.length > HISTORY) this.history.shift();
    this.cards(frame, engine, point);
    if (frame.experts) this.heatmap(frame.experts);
    chart($("chart-cache"), this.history, [["hit", SERIES.hit, 1], ["mpt", SERIES.mpt, null]]);
    chart($("chart-tps"), this.history, [["dec", SERIES.dec, null], ["pre", SERIES.pre, null]]);
    if (engine) this.memory(engine.memory, engine.moe_backend);
    this.requests(frame.in_flight);
  }

  // This interval's expert hit rate and misses per token, from the cumulative counters.
  point(frame, engine) {
    const e = engine && engine.expert_cache;
    const point = { dec: frame.rates.generation_tokens_per_s, pre: frame.rates.prompt_tokens_per_s, hit: null, mpt: null };
    if (e && this.previous) {
      const hits = e.hits - this.previous.hits, misses = e.misses - this.previous.misses;
      const tokens = e.tokens - this.previous.tokens;
      if (hits + misses > 0) point.hit = hits / (hits + misses);
      if (tokens > 0) point.mpt = misses / tokens;
    }
    if (e) this.previous = { hits: e.hits, misses: e.misses, tokens: e.tokens };
    return point;
  }

  cards(frame, engine, point) {
    const e = engine && engine.expert_cache;
    $("c-hit").textContent = point.hit != null ? fmt.pct(point.hit) : e ? fmt.pct(e.hit_rate) : "–";
    $("c-hit-sub").textContent = e ? `${fmt.pct(e.hit_rate)} since start` : "";
    $("c-mpt").textContent = point.mpt != null ? point.mpt.toFixed(2) : e ? e.misses_per_token.toFixed(2) : "–";
    $("c-mpt-sub").textContent = e ? `${fmt.bytes(e.bytes_copied)} copied, ${e.experts_cpu} on CPU` : "";
    $("c-dec").textContent = fmt.rate(point.dec);
    $("c-dec-sub").textContent = `${fmt.rate(frame.stats.throughput.generation_tokens_per_s)} over ${frame.stats.window_s} s`;
    $("c-pre").textContent = fmt.rate(point.pre);
    $("c-pre-sub").textContent = `${fmt.rate(frame.stats.throughput.prompt_tokens_per_s)} over ${frame.stats.window_s} s`;
    const r = frame.stats.requests;
    $("c-req").textContent = `${r.running} running`;
    $("c-req-sub").textContent = `${r.queued} queued, ${r.finished} finished`;
    if (engine) {
      $("c-kv").textContent = fmt.pct(engine.kv_pool.usage);
      $("c-kv-sub").textContent = `${engine.kv_pool.pages_in_use}/${engine.kv_pool.pages_total} pages, ` +
        `prefix hits ${fmt.pct(engine.prefix_cache.hit_rate)}`;
    }
  }

  heatmap(map) {
    const canvas = $("heatmap");
    const rows = map.cells.length, cols = map.num_experts;
    // Square-ish cells as large as fit ~620 × 320 px: a tiny model's 4 × 16 map stays readable.
    const cw = Math.max(1, Math.min(28, Math.floor(620 / cols)));
    const ch = Math.max(2, Math.min(28, Math.floor(320 / Math.max(rows, 1)), Math.max(cw, 4)));
    if (canvas.width !== cols * cw || canvas.height !== rows * ch) {
      canvas.width = cols * cw;
      canvas.height = rows * ch;
    }
    const ctx = canvas.getContext("2d");
    const counts = [0, 0, 0, 0, 0];
    map.cells.forEach((row, y) => {
      for (let x = 0; x < row.length; x++) {
        const code = row.charCodeAt(x) - 48;
        counts[code]++;
        ctx.fillStyle = COLORS[code] || COLORS[0];
        ctx.fillRect(x * cw, y * ch, cw - (cw > 3 ? 1 : 0), ch - (ch > 3 ? 1 : 0));
      }
    });
    this.cells = map.cells;
    this.mapVersion++;
    canvas.dataset.version = String(this.mapVersion);
    canvas.dataset.events = String(counts[2] + counts[3] + counts[4]);
    $("heat-caption").textContent =
      `${rows} MoE layers × ${cols} experts · last ${(this.lastInterval || 0.5).toFixed(1)} s: ` +
      `${counts[2]} hit, ${counts[3]} copied, ${counts[4]} on CPU`;
  }

  memory(memory, backend) {
    const plan = memory.plan || {};
    const parts = [
      ["CUDA context", plan.context, "#8b93a7"],
      ["dense weights", plan.weights, "#4c8df6"],
      ["resident experts", plan.experts_resident, "#3fbf6f"],
      [`expert slots (${plan.num_slots || 0})`, (plan.num_slots || 0) * (plan.slot_bytes || 0), "#4c6aa8"],
      [`KV cache (${plan.kv_tokens || 0} tokens)`, plan.kv_bytes, "#e8823d"],
      ["workspace", plan.workspace, "#c9a227"],
    ].filter((p) => p[1] > 0);
    const total = parts.reduce((s, p) => s + p[1], 0);
    const cap = plan.budget || null;
    const scale = Math.max(cap || 0, total, memory.device_reserved_bytes || 0) || 1;
    const bar = document.createElement("div");
    bar.className = "bar";
    for (const [name, bytes, color] of parts) {
      const seg = document.createElement("span");
      seg.style.width = (100 * bytes / scale) + "%";
      seg.style.background = color;
      seg.title = `${name}: ${fmt.bytes(bytes)}`;
      bar.append(seg);
    }
    if (cap) {
      const mark = document.createElement("i");
      mark.className = "cap";
      mark.style.left = (100 * cap / scale) + "%";
      mark.title = "--gpu-memory cap " + fmt.bytes(cap);
      bar.append(mark);
    }
    const legend = document.createElement("div");
    legend.className = "mlegend";
    for (const [name, bytes, color] of parts) {
      const item = document.createElement("span");
      const sw = document.createElement("i");
      sw.className = "sw";
      sw.style.background = color;
      item.append(sw, `${name} ${fmt.bytes(bytes)}`);
      legend.append(item);
    }
    const used = memory.device_allocated_bytes != null ? `, allocated now ${fmt.bytes(memory.device_allocated_bytes)}` : "";
    $("mem-caption").textContent = `${fmt.bytes(total)} planned of ` +
      (cap ? `${fmt.bytes(cap)} (--gpu-memory)` : "no cap (CPU)") + `${used} · moe backend ${backend || "–"}`;
    $("memory").replaceChildren(bar, legend);
  }

  requests(list) {
    const body = $("requests");
    if (!list.length) {
      const row = document.createElement("tr");
      const cell = document.createElement("td");
      cell.colSpan = 6;
      cell.className = "hint";
      cell.textContent = "none running";
      row.append(cell);
      body.replaceChildren(row);
      return;
    }
    body.replaceChildren(...list.map((r) => {
      const row = document.createElement("tr");
      for (const text of [r.id.slice(0, 10), r.endpoint, r.status, r.prompt_tokens, r.completion_tokens,
        r.decode_tokens_per_s ? r.decode_tokens_per_s.toFixed(1) : "–"]) {
        const cell = document.createElement("td");
        cell.textContent = String(text);
        row.append(cell);
      }
      return row;
    }));
  }
}

// Lines over the history; each series [key, colour, fixed max or null] on its own scale.
function chart(canvas, history, series) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 4;
  ctx.clearRect(0, 0, w, h);
  ctx.strokeStyle = "rgba(128,128,128,0.25)";
  ctx.beginPath();
  for (let i = 1; i < 4; i++) { ctx.moveTo(0, (h * i) / 4); ctx.lineTo(w, (h * i) / 4); }
  ctx.stroke();
  series.forEach(([key, color, fixedMax], n) => {
    const values = history.map((p) => p[key]);
    const max = fixedMax ?? Math.max(1e-9, ...values.filter((v) => v != null)) * 1.1;
    ctx.strokeStyle = color;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    let drawing = false;
    values.forEach((v, i) => {
      if (v == null) { drawing = false; return; }
      const x = (w * i) / (HISTORY - 1), y = h - pad - (h - 2 * pad) * Math.min(v / max, 1);
      if (drawing) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      drawing = true;
    });
    ctx.stroke();
    ctx.fillStyle = color;
    ctx.font = "10px sans-serif";
    const last = values.filter((v) => v != null).pop();
    ctx.fillText(last == null ? "–" : "max " + fmt.rate(max / (fixedMax ? 1 : 1.1)), w - 60, 12 + 12 * n);
  });
}
