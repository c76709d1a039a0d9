// agentrl view: the page. Every piece of run, model or env text goes in with
// textContent (through el() below), never as HTML.
"use strict";

const BUNDLE = typeof window.AGENTRL_INDEX === "object";
const main = document.getElementById("main");
const crumbs = document.getElementById("crumbs");
let routeId = 0; // bumped on each navigation; live polls of an old page stop

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function link(text, hash) { return el("a", { href: "#" + hash }, text); }
function fmt(v, digits = 3) {
  if (v === null || v === undefined) return "";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(digits);
  return String(v);
}
function duration(s) {
  if (s === null || s === undefined) return "";
  if (s < 120) return s.toFixed(0) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
function qs(params) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") p.set(k, v);
  return p.toString();
}

// -- data: the server's JSON endpoints, or a bundle's data/*.js scripts --------------------

function loadScript(name) {
  return new Promise((resolve, reject) => {
    const s = document.createElement("script");
    s.src = "data/" + name;
    s.onload = resolve;
    s.onerror = () => reject(new Error("missing bundle file data/" + name));
    document.head.appendChild(s);
  });
}

async function bundled(key) {
  let name = window.AGENTRL_INDEX[key];
  if (name === undefined && key.startsWith("episode?") && !key.includes("&attempt=")) {
    const keys = Object.keys(window.AGENTRL_INDEX).filter((k) => k.startsWith(key + "&attempt="));
    keys.sort((a, b) => Number(a.split("=").pop()) - Number(b.split("=").pop()));
    if (keys.length) { key = keys[keys.length - 1]; name = window.AGENTRL_INDEX[key]; }
  }
  if (name === undefined) throw new Error("this bundle does not hold " + key);
  if (!(key in window.AGENTRL_DATA)) await loadScript(name);
  return window.AGENTRL_DATA[key];
}

async function api(name, params) {
  if (BUNDLE) {
    if (name === "episodes") return bundledEpisodes(params);
    if (name === "live") return { episodes: [], alive: false };
    // the keys data/index.js names: the parameters as given, unencoded, in this order
    const given = Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== "");
    const key = name + (name === "runs" ? "" : "?" + given.map(([k, v]) => k + "=" + v).join("&"));
    return bundled(key);
  }
  const response = await fetch("api/" + name + "?" + qs(params), { credentials: "same-origin" });
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok || body.error) throw new Error(body.error || response.statusText);
  return body;
}

async function bundledEpisodes(params) {
  // A bundle holds the whole list; the page filters and pages it as the server would.
  const all = await bundled("episodes?run=" + params.run);
  const num = (k) => (params[k] === undefined || params[k] === "" ? null : Number(params[k]));
  const rows = all.rows.filter((r) =>
    (!params.state || r.state === params.state) &&
    (!params.env || r.env_id === params.env) &&
    (!params.failure || r.failure === params.failure) &&
    (!params.origin || r.origin === params.origin) &&
    (num("attempt") === null || r.attempt === num("attempt")) &&
    (num("min_reward") === null || (r.reward !== null && r.reward >= num("min_reward"))) &&
    (num("max_reward") === null || (r.reward !== null && r.reward <= num("max_reward"))) &&
    (num("min_version_span") === null ||
      (r.v_min !== null && r.v_max !== null && r.v_max - r.v_min >= num("min_version_span"))));
  const limit = num("limit") || 50, offset = num("offset") || 0;
  return { ...all, rows: rows.slice(offset, offset + limit), total: rows.length, limit, offset };
}

// -- routing ------------------------------------------------------------------------------

function route() {
  routeId += 1;
  const hash = location.hash.slice(1) || "/";
  const [path, query] = hash.split("?");
  const params = Object.fromEntries(new URLSearchParams(query || ""));
  main.replaceChildren(el("p", { class: "muted" }, "loading…"));
  crumbs.replaceChildren();
  const pages = { "/": runsPage, "/run": runPage, "/episode": episodePage };
  const page = pages[path] || runsPage;
  page(params, routeId).catch((e) => main.replaceChildren(el("p", { class: "error" }, e.message)));
}
window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", route);

function table(headers, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}
function td(v, cls) { return el("td", cls ? { class: cls } : {}, v); }

// -- runs ---------------------------------------------------------------------------------

async function runsPage() {
  const data = await api("runs", {});
  const rows = data.runs.map((r) => el("tr", { "data-run": r.id },
    td(link(r.id === "." ? r.name : r.id, "/run?" + qs({ run: r.id }))), td(r.kind),
    td(el("span", { class: "status-" + r.status }, r.status)),
    td(fmt(r.steps) + (r.steps_planned ? " / " + r.steps_planned : ""), "num"),
    td(fmt(r.success), "num"), td(fmt(r.reward), "num"), td(duration(r.wall_s), "num"),
    td(fmt(r.episodes), "num")));
  main.replaceChildren(el("h1", {}, "Runs"), el("p", { class: "muted" }, data.root),
    rows.length ? table(["run", "kind", "status", "steps", "success", "reward", "wall time", "episodes"], rows)
      : el("p", {}, "no run directories (folders with episodes.db) here"));
}

// -- a run --------------------------------------------------------------------------------

const CHARTS = ["reward_mean", "success_rate", "tool_use_rate", "staleness_mean", "staleness_max",
  "tokens_per_s", "trained_tokens_per_s", "train_s", "generation_busy_s", "publish_s", "loss", "kl",
  "grad_norm", "clip_fraction", "is_weight_mean", "masked_fraction", "turns_per_episode",
  "pass@1", "pass@k", "avg@k"];

async function runPage(params, id) {
  const run = params.run;
  const data = await api("run", { run });
  const s = data.summary;
  crumbs.replaceChildren(" / ", link(s.id === "." ? s.name : s.id, "/run?" + qs({ run })));
  const live = el("div", { id: "live" });
  const episodes = el("div", { id: "episodes" });
  main.replaceChildren(
    el("h1", {}, s.name),
    el("p", {}, s.kind + " run · ", el("span", { class: "status-" + s.status, id: "run-status" }, s.status),
      ` · step ${fmt(s.steps)}` + (s.steps_planned ? "/" + s.steps_planned : "") +
      ` · ${fmt(s.episodes)} episodes · wall ${duration(s.wall_s)}`),
    live, el("h2", {}, "Metrics"), charts(data.metrics), el("h2", {}, "Episodes"), episodes,
    el("h2", {}, "Optimizer steps (the trajectories each trained on)"), cohorts(run, data.cohorts),
    el("h2", {}, "Config"), el("pre", { id: "config" }, data.config_toml || JSON.stringify(data.config, null, 2)));
  await episodeTable(episodes, run, params);
  if (s.status === "running") pollLive(live, run, id);
}

function charts(rows) {
  const box = el("div", { class: "charts" });
  const byKind = {};
  for (const r of rows) (byKind[r.kind] = byKind[r.kind] || []).push(r);
  for (const [kind, list] of Object.entries(byKind)) {
    const keys = new Set(list.flatMap((r) => Object.keys(r)));
    for (const key of keys) {
      const known = CHARTS.includes(key) || key.startsWith("pass@") || key.startsWith("avg@");
      if (!known || key === "step") continue;
      const points = list.filter((r) => typeof r[key] === "number").map((r) => [r.step, r[key]]);
      if (points.length) box.appendChild(lineChart(kind + "/" + key, points));
    }
  }
  if (!box.children.length) box.appendChild(el("p", { class: "muted" }, "no metrics.jsonl rows yet"));
  return box;
}

function lineChart(title, points) {
  const W = 300, H = 140, L = 44, B = 20, T = 16;
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const sx = (x) => L + ((x - x0) / (x1 - x0 || 1)) * (W - L - 6);
  const sy = (y) => H - B - ((y - y0) / (y1 - y0 || 1)) * (H - B - T);
  const root = svg("svg", { width: W, height: H, class: "chart", "data-metric": title });
  const label = (x, y, text, anchor) => {
    const t = svg("text", { x, y, "text-anchor": anchor || "start" });
    t.textContent = text;
    root.appendChild(t);
  };
  label(L, 11, title);
  label(L - 4, sy(y1) + 3, fmt(y1), "end");
  label(L - 4, sy(y0) + 3, fmt(y0), "end");
  label(L, H - 5, "step " + x0);
  label(W - 6, H - 5, String(x1), "end");
  root.appendChild(svg("line", { x1: L, y1: H - B, x2: W - 6, y2: H - B, stroke: "#bbb" }));
  root.appendChild(svg("polyline", { points: points.map((p) => sx(p[0]) + "," + sy(p[1])).join(" ") }));
  return root;
}

function cohorts(run, list) {
  if (!list.length) return el("p", { class: "muted" }, "no trained steps");
  return table(["step", "trajectories", "reward mean", "sampled tokens", "episodes"], list.map((c) =>
    el("tr", {}, td(c.step, "num"), td(c.trajectories, "num"), td(fmt(c.reward_mean), "num"),
      td(c.sampled, "num"), td(c.episodes.slice(0, 12).flatMap((e, i) =>
        [i ? ", " : "", link(e, "/episode?" + qs({ run, id: e }))]),
      c.episodes.length > 12 ? " …" : ""))));
}

const FILTERS = [["state", "state", "states"], ["env", "env", "envs"], ["min_reward", "reward ≥"],
  ["max_reward", "reward ≤"], ["min_version_span", "version span ≥"], ["failure", "failure", "failures"],
  ["attempt", "attempt", "attempts"], ["origin", "origin", ["run", "replay"]]];

async function episodeTable(box, run, params) {
  const state = { run, limit: Number(params.limit) || 50, offset: 0 };
  for (const [k] of FILTERS) if (params[k]) state[k] = params[k];
  const form = el("form", { class: "filters", id: "episode-filters" });
  const body = el("div");
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    for (const [k] of FILTERS) state[k] = form.elements[k].value;
    state.offset = 0;
    show();
  });
  async function show() {
    const page = await api("episodes", state);
    if (!form.children.length) buildFilters(form, page, state);
    const rows = page.rows.map((r) => el("tr", { class: "episode-row", "data-episode": r.episode_id, "data-attempt": r.attempt },
      td(link(r.episode_id, "/episode?" + qs({ run, id: r.episode_id, attempt: r.attempt }))),
      td(r.attempt, "num"), td(r.env_id), td(r.state), td(fmt(r.reward), "num"), td(fmt(r.turns), "num"),
      td(fmt(r.tokens), "num"), td(fmt(r.sampled), "num"),
      td(r.v_min === null ? "" : r.v_min + ".." + r.v_max), td(r.failure || ""), td((r.reason || "").slice(0, 80))));
    const last = Math.min(page.offset + page.limit, page.total);
    const pager = el("div", { class: "pager" },
      el("button", { type: "button", id: "prev", ...(page.offset ? {} : { disabled: "" }), onclick: () => { state.offset = Math.max(0, page.offset - page.limit); show(); } }, "‹ newer"),
      el("span", { id: "page-info" }, `${page.total ? page.offset + 1 : 0}–${last} of ${page.total}`),
      el("button", { type: "button", id: "next", ...(last < page.total ? {} : { disabled: "" }), onclick: () => { state.offset = page.offset + page.limit; show(); } }, "older ›"));
    body.replaceChildren(pager, table(["episode", "try", "env", "state", "reward", "turns", "tokens",
      "sampled", "versions", "failure", "reason"], rows));
  }
  box.replaceChildren(form, body);
  await show();
}

function buildFilters(form, page, state) {
  for (const [key, label, values] of FILTERS) {
    const options = Array.isArray(values) ? values : values ? page[values] || [] : null;
    const input = options
      ? el("select", { name: key }, el("option", { value: "" }, "any"), options.map((v) => el("option", { value: v }, v)))
      : el("input", { name: key, type: "number", step: "any" });
    input.value = state[key] || "";
    form.appendChild(el("label", {}, label, input));
  }
  form.appendChild(el("button", { type: "submit", id: "apply" }, "filter"));
}

function pollLive(box, run, id) {
  // Every second while this page shows: what `agentrl top` shows, from status.json.
  const tick = async () => {
    if (id !== routeId) return;
    let data;
    try { data = await api("live", { run }); } catch (e) { box.replaceChildren(el("p", { class: "error" }, e.message)); return; }
    if (id !== routeId) return;
    const rows = data.episodes.map((e) => {
      const tokens = Object.values(e.tokens_by_version || {}).reduce((a, b) => a + b, 0);
      return el("tr", { class: "live-episode", "data-episode": e.episode },
        td(link(e.episode, "/episode?" + qs({ run, id: e.episode }))), td(e.env), td(e.turn, "num"),
        td(e.phase), td(tokens, "num"), td(data.version - e.started_version, "num"), td(duration(e.age_s), "num"));
    });
    box.replaceChildren(el("div", { class: "live" },
      el("strong", {}, "live"), ` · ${data.state || "?"} · step ${fmt(data.step)} · version ${fmt(data.version)} · ${rows.length} in flight`,
      rows.length ? table(["episode", "env", "turn", "phase", "tokens", "age (versions)", "age"], rows) : ""));
    if (data.alive) setTimeout(tick, 1000);
  };
  tick();
}

// -- an episode ---------------------------------------------------------------------------

const OVERLAYS = { version: "policy version", logprob: "behaviour logprob", none: "no colour" };

function versionColour(v) { return `hsl(${(v * 67) % 360}, 75%, 78%)`; }
function logprobColour(lp) {
  const p = Math.exp(lp);
  return `hsl(${Math.round(120 * p)}, 75%, 78%)`;
}

async function episodePage(params) {
  const { run, id } = params;
  const ep = await api("episode", { run, id, attempt: params.attempt });
  crumbs.replaceChildren(" / ", link(run === "." ? "run" : run, "/run?" + qs({ run })), " / ", ep.episode_id);
  const overlay = el("select", { id: "overlay" }, Object.entries(OVERLAYS).map(([k, v]) => el("option", { value: k }, v)));
  if (ep.segments.some((s) => s.trainer)) for (const k of ["trainer_logprob", "importance_weight", "advantage", "masked"])
    overlay.appendChild(el("option", { value: k }, k.replace("_", " ")));
  const legend = el("div", { class: "legend", id: "legend" });
  const tokens = el("div", { id: "tokens", class: "tokens" });
  const paint = () => colourTokens(tokens, legend, ep, overlay.value);
  overlay.addEventListener("change", paint);
  tokens.addEventListener("mouseover", (e) => tokenTitle(e.target, ep));
  main.replaceChildren(
    el("h1", {}, ep.episode_id),
    el("p", {}, `${ep.env_id || ""} · attempt ${ep.attempt} · `, el("span", { id: "episode-state" }, ep.state),
      ep.reward === null ? "" : ` · reward ${fmt(ep.reward)}`, ep.failure ? ` · failure ${ep.failure}` : "",
      ep.reason ? ` · ${ep.reason}` : ""),
    attemptsBox(run, ep), lineageBox(run, ep),
    el("h2", {}, "Transcript"), transcript(ep),
    el("h2", {}, "Tokens"), el("label", {}, "colour by ", overlay), legend, tokens);
  buildTokens(tokens, ep);
  tokens.before(resumeMarks(ep)); // episode-extras.js
  paint();
  await forkControls(run, ep, document.getElementById("transcript"));
}

function attemptsBox(run, ep) {
  return el("div", { class: "attempts", id: "attempts" }, el("strong", {}, `attempts (${ep.attempts.length}): `),
    ep.attempts.flatMap((a, i) => [i ? " · " : "",
      el("a", { href: "#/episode?" + qs({ run, id: ep.episode_id, attempt: a.attempt }), class: a.attempt === ep.attempt ? "attempt current" : "attempt", "data-attempt": a.attempt },
        `#${a.attempt} ${a.state}` + (a.tokens ? ` (${a.tokens} tokens)` : "") + (a.reason ? `: ${a.reason.slice(0, 60)}` : ""))]));
}

function lineageBox(run, ep) {
  const l = ep.lineage;
  const parts = [];
  if (l.parent) parts.push(el("div", {}, (l.fork_turn === null ? "resumed from " : `forked at turn ${l.fork_turn} from `),
    link(l.parent, "/episode?" + qs({ run, id: l.parent }))));
  if (l.first_diff_turn !== null) parts.push(el("div", { id: "first-diff" }, "first differing turn: ",
    el("span", { class: "first-diff-label" }, String(l.first_diff_turn))));
  if (l.derived.length) parts.push(el("div", {}, "derived: ", l.derived.flatMap((d, i) => [i ? ", " : "", link(d, "/episode?" + qs({ run, id: d }))])));
  return el("div", { id: "lineage" }, parts);
}

function transcript(ep) {
  const box = el("div", { id: "transcript" });
  let turn = 0;
  for (const m of ep.messages) {
    const role = m.role || "?";
    const head = el("div", { class: "role" }, role + (m.name ? " " + m.name : ""));
    const node = el("div", { class: "msg role-" + role }, head, el("div", { class: "content" }, contentText(m.content)));
    if (role === "assistant") {
      node.setAttribute("data-turn", turn);
      const reward = ep.turn_rewards[turn];
      head.appendChild(document.createTextNode(` · turn ${turn}` + (reward === undefined ? "" : ` · reward ${fmt(reward)}`)));
      if (ep.lineage.first_diff_turn === turn) {
        node.classList.add("first-diff");
        head.appendChild(el("span", { class: "first-diff-label" }, " · first differing turn"));
      }
      for (const call of m.tool_calls || []) {
        const fn = call.function || call;
        const args = typeof fn.arguments === "string" ? fn.arguments : JSON.stringify(fn.arguments);
        node.appendChild(el("div", { class: "toolcall" }, `call ${fn.name}(${args})`));
      }
      turn += 1;
    }
    box.appendChild(node);
  }
  if (ep.env_log.length) box.appendChild(envLog(ep.env_log));
  return box;
}

function envLog(log) {
  // What the env saw and said, entry by entry; a state snapshot as its change from the last.
  const items = [];
  let state = null;
  log.forEach((e) => {
    const short = (v) => (typeof v === "string" ? v : JSON.stringify(v));
    let line;
    if ("tool" in e) line = `tool ${e.tool}(${short(e.arguments)}) → ${short(e.result)}`;
    else if ("action" in e) line = `step ${short(e.action)} → reward ${fmt(e.reward)}` + (e.obs ? `; obs ${short(e.obs)}` : "");
    else line = `reset → obs ${short(e.obs)}`;
    const item = el("li", { class: "env-entry" }, el("span", {}, line));
    if (e.state !== undefined) {
      item.appendChild(el("div", { class: "state-diff" }, "state: " + stateDiff(state, e.state)));
      state = e.state;
    }
    items.push(item);
  });
  return el("details", { id: "env-log" }, el("summary", {}, `env log (${log.length} entries: observations, rewards, tool results, state changes)`),
    el("ol", { class: "env-log", start: 0 }, items));
}

function stateDiff(before, after) {
  if (before === null || typeof before !== "object" || typeof after !== "object" || after === null)
    return JSON.stringify(after);
  const changes = [];
  for (const k of new Set([...Object.keys(before), ...Object.keys(after)])) {
    const a = JSON.stringify(before[k]), b = JSON.stringify(after[k]);
    if (a === b) continue;
    changes.push(k in after ? (k in before ? `${k}: ${a} → ${b}` : `+${k}: ${b}`) : `-${k}`);
  }
  return changes.length ? changes.join(", ") : "unchanged";
}

function contentText(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((p) => (typeof p === "string" ? p : p.text || JSON.stringify(p))).join("");
  return content === null || content === undefined ? "" : JSON.stringify(content);
}

const CHUNK = 512; // tokens per block: blocks off screen are neither laid out nor painted

function buildTokens(box, ep) {
  // One block per span (prompt, an assistant turn, a tool result, an env reply), split
  // every CHUNK tokens; ep.nodes[s][i] is token i of segment s.
  const frag = document.createDocumentFragment();
  ep.nodes = ep.segments.map((seg, si) => {
    if (ep.segments.length > 1) frag.appendChild(el("div", { class: "muted" }, `segment ${si}`));
    const nodes = new Array(seg.ids.length);
    const spans = seg.spans.length ? seg.spans.slice() : [["tokens", 0, seg.ids.length, 0]];
    const covered = spans[spans.length - 1][2];
    if (covered < seg.ids.length) spans.push(["tokens", covered, seg.ids.length, 0]);
    for (const [kind, start, end, turn] of spans) {
      for (let from = start; from < end; from += CHUNK) {
        const block = el("div", { class: "span-block kind-" + kind });
        if (from === start) block.appendChild(el("span", { class: "span-label" }, `${kind} ${turn}`));
        for (let i = from; i < Math.min(end, from + CHUNK); i++) {
          const node = document.createElement("span");
          node.className = "tok";
          node.textContent = ep.texts[seg.ids[i]];
          node.setAttribute("data-v", seg.versions[i]);
          block.appendChild(node);
          nodes[i] = node;
        }
        frag.appendChild(block);
      }
    }
    return nodes;
  });
  box.replaceChildren(frag);
}

function colourTokens(box, legend, ep, overlay) {
  const versions = new Map();
  ep.segments.forEach((seg, si) => {
    const nodes = ep.nodes[si], trainer = seg.trainer && seg.trainer[overlay];
    for (let i = 0; i < nodes.length; i++) {
      let colour = "";
      if (seg.mask[i]) {
        if (overlay === "version") {
          const v = seg.versions[i];
          colour = versions.get(v);
          if (colour === undefined) versions.set(v, (colour = versionColour(v)));
        } else if (overlay === "logprob" && seg.logprobs[i] !== null) colour = logprobColour(seg.logprobs[i]);
        else if (trainer) colour = trainerColour(overlay, trainer[i]);
      }
      nodes[i].style.backgroundColor = colour;
    }
  });
  const items = [];
  if (overlay === "version") for (const [v, c] of [...versions.entries()].sort((a, b) => a[0] - b[0]))
    items.push(el("span", { class: "legend-item", "data-v": v }, swatch(c), "v" + v));
  if (overlay === "logprob") items.push(el("span", {}, swatch(logprobColour(-5)), "unlikely"), el("span", {}, swatch(logprobColour(0)), "p = 1"));
  items.push(el("span", { class: "muted" }, "uncoloured: prompt, env and tool tokens (not sampled); hover a token for its values"));
  legend.replaceChildren(...items);
}

function tokenTitle(node, ep) {
  // The values of the token under the pointer, computed when it is hovered.
  if (!node.classList || !node.classList.contains("tok") || node.title) return;
  ep.segments.forEach((seg, si) => {
    const i = ep.nodes[si].indexOf(node);
    if (i < 0) return;
    const parts = [`id ${seg.ids[i]}`, seg.mask[i] ? `version ${seg.versions[i]}` : "not sampled"];
    if (seg.logprobs[i] !== null) parts.push(`logprob ${seg.logprobs[i]}`);
    for (const [k, values] of Object.entries(seg.trainer || {})) parts.push(`${k} ${fmt(values[i])}`);
    node.title = parts.join(" · ");
  });
}

function trainerColour(key, v) {
  if (v === null || v === undefined) return "";
  if (key === "masked") return v ? "hsl(0, 75%, 78%)" : "";
  if (key === "trainer_logprob") return logprobColour(v);
  const x = Math.max(-1, Math.min(1, key === "importance_weight" ? v - 1 : v));
  return x >= 0 ? `hsl(120, 70%, ${95 - 20 * x}%)` : `hsl(0, 70%, ${95 + 20 * x}%)`;
}

function swatch(colour) {
  const s = el("span", { class: "swatch" });
  s.style.backgroundColor = colour;
  return s;
}
