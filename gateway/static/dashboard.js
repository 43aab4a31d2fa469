// specserve admin dashboard: polls stats and policy (URLs relative to /admin/ui), draws SVG charts, edits the policy.
"use strict";

(() => {
  const POLL_MS = 1000;
  const POLICY_POLL_MS = 5000;
  const WINDOW_S = 120;
  const MODES = ["auto", "off", "draft", "ngram"];
  const PALETTE = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#db2777", "#0891b2"];
  const SERIES = { tps: "#0d9488", running: "#2563eb", waiting: "#ea580c" }; // as the legend swatches in the CSS
  const SVG_NS = "http://www.w3.org/2000/svg";

  const $ = (id) => document.getElementById(id);
  const samples = []; // {t, running, waiting, tps, rates: {proposer: rate | null}}, oldest first
  const colors = {};
  const inputs = new Map(); // policy field name -> its <input> or <select>
  let previous = null; // {t, tokens, totals} of the last stats response
  let policy = null; // the settings as last read from the server

  class ApiError extends Error {
    constructor(status, message, param) {
      super(message);
      this.status = status;
      this.param = param;
    }
  }

  async function api(path, options = {}) {
    const response = await fetch(path, { cache: "no-store", credentials: "same-origin", ...options });
    const body = await response.json().catch(() => null);
    if (!response.ok) {
      const error = (body && body.error) || {};
      throw new ApiError(response.status, error.message || response.statusText || "request failed", error.param);
    }
    return body;
  }

  // ---------------------------------------------------------------- formatting
  const fmtInt = (v) => (typeof v === "number" ? Math.round(v).toLocaleString("en-US") : "–");
  const fmtPct = (v) => (typeof v === "number" ? `${(100 * v).toFixed(v >= 0.995 || v === 0 ? 0 : 1)}%` : "–");
  function fmtRate(v) {
    if (typeof v !== "number") return "–";
    if (v === 0) return "0";
    if (v >= 1000) return `${(v / 1000).toFixed(v >= 10000 ? 0 : 1)}k`;
    return v >= 100 ? v.toFixed(0) : v.toFixed(1);
  }
  const fmtTick = (v) => (v >= 1000 ? `${Math.round(v / 10) / 100}k` : String(Math.round(v * 100) / 100));
  function fmtDuration(seconds) {
    const s = Math.floor(seconds);
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    return h ? `${h}h ${m}m` : m ? `${m}m ${s % 60}s` : `${s}s`;
  }
  function setValue(id, value, text) {
    const el = $(id);
    el.textContent = text;
    el.dataset.value = typeof value === "number" && Number.isFinite(value) ? String(value) : "";
  }
  function colorOf(name) {
    if (!(name in colors)) colors[name] = PALETTE[Object.keys(colors).length % PALETTE.length];
    return colors[name];
  }

  // ---------------------------------------------------------------- stats
  function proposerTotals(engine) {
    if (engine.proposers !== undefined) {
      const totals = {};
      for (const [name, p] of Object.entries(engine.proposers)) {
        totals[name] = { drafted: p.drafted_tokens, accepted: p.accepted_tokens };
      }
      return totals;
    }
    if (typeof engine.spec_decode_num_draft_tokens !== "number") return {};
    return { all: { drafted: engine.spec_decode_num_draft_tokens, accepted: engine.spec_decode_num_accepted_tokens } };
  }

  /** One sample per response: rates are deltas of the engine's counters since the previous response. */
  function record(engine, t) {
    const tokens = engine.num_generated_tokens;
    const totals = proposerTotals(engine);
    const sample = { t, running: engine.num_running, waiting: engine.num_waiting, tps: null, rates: {} };
    if (previous) {
      const dt = t - previous.t;
      if (typeof tokens === "number" && typeof previous.tokens === "number" && tokens >= previous.tokens && dt > 0) {
        sample.tps = (tokens - previous.tokens) / dt;
      }
      for (const [name, now] of Object.entries(totals)) {
        const before = previous.totals[name] || { drafted: 0, accepted: 0 };
        const drafted = now.drafted - before.drafted;
        const accepted = now.accepted - before.accepted;
        sample.rates[name] = drafted > 0 && accepted >= 0 ? accepted / drafted : null;
      }
    }
    previous = { t, tokens, totals };
    samples.push(sample);
    while (samples.length && samples[0].t < t - WINDOW_S - 5) samples.shift();
  }

  function renderFigures(body) {
    const engine = body.engine;
    const gateway = body.gateway || {};
    const last = samples[samples.length - 1];
    setValue("running", engine.num_running, fmtInt(engine.num_running));
    setValue("waiting", engine.num_waiting, fmtInt(engine.num_waiting));
    if (engine.num_generated_tokens === undefined) setValue("tokens-per-s", null, "n/a");
    else setValue("tokens-per-s", last.tps, fmtRate(last.tps));

    const used = engine.kv_used_blocks;
    const total = engine.kv_total_blocks;
    const usage = total ? used / total : null;
    setValue("kv-usage", usage, fmtPct(usage));
    $("kv-bar").style.width = `${Math.min(100, 100 * (usage || 0))}%`;
    $("kv-bar").classList.toggle("high", usage !== null && usage >= 0.9);
    $("kv-detail").textContent = total ? `${fmtInt(used)} of ${fmtInt(total)} blocks in use` : "not reported";

    const drafted = engine.spec_decode_num_draft_tokens;
    const rate = drafted ? engine.spec_decode_num_accepted_tokens / drafted : null;
    setValue("acceptance", rate, fmtPct(rate));
    $("acceptance-detail").textContent = drafted
      ? `${fmtInt(engine.spec_decode_num_accepted_tokens)} of ${fmtInt(drafted)} drafted tokens`
      : "no tokens drafted yet";

    $("replica").textContent = gateway.replica || "–";
    $("uptime").textContent = typeof gateway.uptime_s === "number" ? fmtDuration(gateway.uptime_s) : "–";
    $("in-flight").textContent = fmtInt(gateway.num_in_flight);
    $("redis").textContent = typeof gateway.redis === "string" ? gateway.redis : JSON.stringify(gateway.redis || "–");
    showPolicyName(engine);
  }

  function renderCharts(engine, now) {
    const names = new Set();
    for (const s of samples) Object.keys(s.rates).forEach((name) => names.add(name));
    const acceptance = [...names].sort().map((name) => ({
      color: colorOf(name),
      points: samples.map((s) => [s.t, name in s.rates ? s.rates[name] : null]),
    }));
    lineChart($("acceptance-chart"), acceptance, { now, yMax: 1, format: (v) => `${Math.round(100 * v)}%` });
    renderAcceptanceLegend([...names].sort(), engine);

    lineChart($("throughput-chart"), [{ color: SERIES.tps, points: samples.map((s) => [s.t, s.tps]) }],
      { now, format: fmtTick, empty: engine.num_generated_tokens === undefined ? "not reported by this engine" : "" });
    lineChart($("requests-chart"), [
      { color: SERIES.running, points: samples.map((s) => [s.t, s.running]) },
      { color: SERIES.waiting, points: samples.map((s) => [s.t, s.waiting]) },
    ], { now, format: fmtTick, integer: true });

    const chosen = engine.policy && engine.policy.chosen_k;
    histogram($("k-histogram"), chosen && Array.isArray(chosen.histogram) ? chosen.histogram : null);
    const plain = chosen ? chosen.plain_decode_fraction : null;
    $("k-detail").textContent = chosen
      ? `${fmtInt(chosen.num_request_steps)} request-steps since start` + (typeof plain === "number" ? ` · k = 0 (plain decode) ${fmtPct(plain)}` : "")
      : "request-steps since start";
  }

  function renderAcceptanceLegend(names, engine) {
    const legend = $("acceptance-legend");
    legend.replaceChildren();
    if (!names.length) legend.textContent = "no speculation rounds yet";
    for (const name of names) {
      const recent = samples.map((s) => s.rates[name]).filter((v) => typeof v === "number");
      const overall = engine.proposers && engine.proposers[name] ? engine.proposers[name].acceptance_rate : null;
      const item = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.className = "swatch";
      swatch.style.background = colorOf(name);
      const value = document.createElement("b");
      value.textContent = fmtPct(recent.length ? recent[recent.length - 1] : null);
      item.append(swatch, `${name} `, value, typeof overall === "number" ? ` (${fmtPct(overall)} since start)` : "");
      legend.append(item);
    }
  }

  // ---------------------------------------------------------------- charts (plain SVG)
  function el(name, attrs, parent, text) {
    const node = document.createElementNS(SVG_NS, name);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    parent.append(node);
    return node;
  }

  /** The smallest "nice" top (4 ticks of 1, 2 or 5 x 10^n) at or above max. */
  function niceTop(max, integer) {
    const raw = Math.max(max, integer ? 4 : 1e-9) / 4;
    const power = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw * (1 - 1e-9));
    return 4 * (integer ? Math.max(1, Math.round(step)) : step);
  }

  function frame(svg) {
    const width = svg.clientWidth || 600;
    const height = svg.clientHeight || 210;
    svg.replaceChildren();
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    const m = { left: 46, right: 12, top: 8, bottom: 22 };
    return { width, height, m, w: width - m.left - m.right, h: height - m.top - m.bottom };
  }

  function yAxis(svg, f, top, format) {
    for (let i = 0; i <= 4; i++) {
      const v = (top * i) / 4;
      const y = f.m.top + f.h - (f.h * i) / 4;
      el("line", { x1: f.m.left, x2: f.width - f.m.right, y1: y, y2: y, class: i ? "grid" : "axis" }, svg);
      el("text", { x: f.m.left - 8, y: y + 4, "text-anchor": "end" }, svg, format(v));
    }
  }

  function lineChart(svg, series, { now, yMax = null, format = String, integer = false, empty = "" }) {
    const f = frame(svg);
    const visible = (t) => t >= now - WINDOW_S;
    const values = series.flatMap((s) => s.points.filter(([t, v]) => typeof v === "number" && visible(t)).map(([, v]) => v));
    const top = yMax !== null ? yMax : niceTop(Math.max(0, ...values), integer);
    const x = (t) => f.m.left + (1 - (now - t) / WINDOW_S) * f.w;
    const y = (v) => f.m.top + f.h - (Math.min(v, top) / top) * f.h;
    yAxis(svg, f, top, format);
    for (const ago of [120, 90, 60, 30, 0]) {
      el("text", { x: x(now - ago), y: f.height - 5, "text-anchor": ago === 120 ? "start" : ago ? "middle" : "end" }, svg,
        ago ? `−${ago}s` : "now");
    }
    let numPoints = 0;
    for (const { color, points } of series) {
      let d = "";
      let pen = false;
      for (const [t, v] of points) {
        if (typeof v !== "number" || !visible(t)) {
          pen = false;
          continue;
        }
        d += `${pen ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
        if (!pen) el("circle", { cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 2, fill: color }, svg);
        pen = true;
        numPoints++;
      }
      if (d) el("path", { d, class: "series", stroke: color }, svg);
    }
    if (!numPoints) {
      el("text", { x: f.m.left + f.w / 2, y: f.m.top + f.h / 2, "text-anchor": "middle", class: "empty" }, svg,
        empty || "waiting for data…");
    }
    svg.dataset.numPoints = String(numPoints);
  }

  function histogram(svg, counts) {
    const f = frame(svg);
    svg.dataset.numBars = counts ? String(counts.length) : "0";
    if (!counts) {
      el("text", { x: f.width / 2, y: f.height / 2, "text-anchor": "middle", class: "empty" }, svg,
        "not reported by this engine");
      return;
    }
    const total = counts.reduce((a, b) => a + b, 0);
    const top = niceTop(Math.max(0, ...counts), true);
    yAxis(svg, f, top, fmtTick);
    const slot = f.w / Math.max(1, counts.length);
    const barWidth = Math.max(2, Math.min(48, slot * 0.7));
    counts.forEach((count, k) => {
      const cx = f.m.left + slot * (k + 0.5);
      const height = (count / top) * f.h;
      const bar = el("rect", { x: cx - barWidth / 2, y: f.m.top + f.h - height, width: barWidth, height,
        rx: 2, class: k ? "bar" : "bar plain" }, svg);
      el("title", {}, bar, `k = ${k}: ${count.toLocaleString("en-US")} (${fmtPct(total ? count / total : 0)})`);
      if (count) el("text", { x: cx, y: f.m.top + f.h - height - 4, "text-anchor": "middle", class: "count" }, svg, fmtRate(count));
      el("text", { x: cx, y: f.height - 5, "text-anchor": "middle" }, svg, `k=${k}`);
    });
  }

  // ---------------------------------------------------------------- status line and polling
  function setConnection(kind, text) {
    const node = $("connection");
    node.className = `connection ${kind}`;
    node.textContent = text;
  }

  function describe(error) {
    if (error.status === 401 || error.status === 403) return `${error.status}: not authorised; open /admin/ui?key=<admin key>`;
    return error.status ? `${error.status}: ${error.message}` : `server unreachable (${error.message})`;
  }

  async function pollStats() {
    try {
      const body = await api("stats");
      const now = performance.now() / 1000;
      record(body.engine, now);
      renderFigures(body);
      renderCharts(body.engine, now);
      setConnection("live", `live · ${new Date().toLocaleTimeString()}`);
    } catch (error) {
      setConnection("error", describe(error));
    } finally {
      setTimeout(pollStats, POLL_MS);
    }
  }

  // ---------------------------------------------------------------- policy form
  function buildField(name, value) {
    const row = document.createElement("label");
    row.className = "field";
    row.dataset.field = name;
    const caption = document.createElement("span");
    caption.textContent = name;
    let input;
    if (name === "mode" && typeof value === "string") {
      input = document.createElement("select");
      for (const mode of MODES.includes(value) ? MODES : [...MODES, value]) input.append(new Option(mode, mode));
      input.dataset.kind = "string";
    } else {
      input = document.createElement("input");
      input.dataset.kind = typeof value === "number" ? "number" : typeof value === "string" ? "string" : "json";
      input.type = input.dataset.kind === "number" ? "number" : "text";
      if (input.type === "number") input.step = "any";
      if (input.dataset.kind === "json") input.placeholder = "null";
    }
    input.name = name;
    input.id = `policy-${name}`;
    input.autocomplete = "off";
    const mark = () => {
      row.classList.toggle("changed", isChanged(input));
      row.classList.remove("invalid");
    };
    input.addEventListener("input", mark);
    input.addEventListener("change", mark);
    row.append(caption, input);
    return row;
  }

  function shown(value, kind) {
    if (kind === "json") return value === null || value === undefined ? "" : JSON.stringify(value);
    return String(value);
  }

  function parseField(input) {
    const text = input.value.trim();
    if (input.dataset.kind === "number") {
      if (text === "") return null;
      const number = Number(text);
      if (!Number.isFinite(number)) throw new ApiError(0, `${input.name}: must be a number; got ${JSON.stringify(text)}`, input.name);
      return number;
    }
    if (input.dataset.kind === "json") {
      if (text === "" || text === "null") return null;
      try {
        return JSON.parse(text);
      } catch {
        throw new ApiError(0, `${input.name}: must be JSON (a number, [a, b, c] or null)`, input.name);
      }
    }
    return input.value;
  }

  function isChanged(input) {
    try {
      return JSON.stringify(parseField(input)) !== JSON.stringify(policy[input.name]);
    } catch {
      return true;
    }
  }

  /** Show settings; a field the user is editing keeps its value unless ``force``. */
  function renderPolicy(settings, force) {
    policy = settings;
    const container = $("policy-fields");
    for (const [name, value] of Object.entries(settings)) {
      if (!inputs.has(name)) {
        const row = buildField(name, value);
        container.append(row);
        inputs.set(name, row.querySelector("[name]"));
      }
      const input = inputs.get(name);
      const row = input.closest(".field");
      if (force || (!row.classList.contains("changed") && document.activeElement !== input)) {
        input.value = shown(value, input.dataset.kind);
        row.classList.remove("changed", "invalid");
      }
    }
    for (const [name, input] of inputs) {
      if (!(name in settings)) {
        input.closest(".field").remove();
        inputs.delete(name);
      }
    }
  }

  function showMessage(kind, text, param) {
    const node = $("policy-message");
    node.className = `message ${kind}`;
    node.textContent = text;
    if (param && inputs.has(param)) inputs.get(param).closest(".field").classList.add("invalid");
  }

  async function submitPolicy(event) {
    event.preventDefault();
    if (!policy) return;
    const changes = {};
    try {
      for (const [name, input] of inputs) if (isChanged(input)) changes[name] = parseField(input);
    } catch (error) {
      showMessage("error", error.message, error.param);
      return;
    }
    if (!Object.keys(changes).length) {
      showMessage("info", "Nothing to apply: no field was changed.");
      return;
    }
    const button = $("policy-apply");
    button.disabled = true;
    try {
      const updated = await api("policy", {
        method: "PATCH",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(changes),
      });
      renderPolicy(updated, true);
      const summary = Object.entries(changes).map(([name, value]) => `${name} = ${JSON.stringify(value)}`).join(", ");
      showMessage("ok", `Applied at ${new Date().toLocaleTimeString()}: ${summary}`);
    } catch (error) {
      showMessage("error", error.status ? `Rejected (${error.status}): ${error.message}` : error.message, error.param);
    } finally {
      button.disabled = false;
    }
  }

  async function pollPolicy() {
    try {
      renderPolicy(await api("policy"), false);
    } catch (error) {
      if (!policy) showMessage("error", `Could not read the policy: ${describe(error)}`);
    } finally {
      setTimeout(pollPolicy, POLICY_POLL_MS);
    }
  }

  function showPolicyName(stats) {
    const p = stats && stats.policy;
    if (p) $("policy-name").textContent = [p.policy, p.pending_settings ? "change pending" : ""].filter(Boolean).join(" · ");
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("policy-form").addEventListener("submit", submitPolicy);
    $("policy-reset").addEventListener("click", () => {
      if (policy) renderPolicy(policy, true);
      showMessage("", "");
    });
    pollStats();
    pollPolicy();
  });
})();
