// The run explorer's page: plain JavaScript over the server's JSON API (rollwire/explore/server.py),
// charts by uPlot. Everything is read in pages; the curves are extended with what is new every 2 s.
"use strict";

const TOKEN = new URLSearchParams(location.search).get("token");
const PALETTE = ["#3949ab", "#e53935", "#43a047", "#fb8c00", "#8e24aa", "#00897b", "#6d4c41", "#546e7a", "#d81b60", "#7cb342"];
const state = { view: "curves", rolloutOffset: 0, stepOffset: 0, pageSize: 50, curves: { steps: [], drops: [], reloads: [], lag: [] },
                since: 0, charts: {}, tokenMode: "version", selected: null };

async function api(path) {
  const response = await fetch(path, { headers: TOKEN ? { Authorization: `Bearer ${TOKEN}` } : {} });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

const $ = (selector, root = document) => root.querySelector(selector);
const esc = (text) => String(text ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const num = (value, digits = 3) => (value === null || value === undefined ? "–" : Number(value).toFixed(digits));
const when = (ms) => (ms ? new Date(ms).toLocaleTimeString() : "–");
const query = (params) => Object.entries(params).filter(([, v]) => v !== "" && v !== null && v !== undefined)
  .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join("&");

// -- tabs ------------------------------------------------------------------------------------------

function show(view) {
  state.view = view;
  document.querySelectorAll("nav button").forEach((b) => b.classList.toggle("active", b.dataset.view === view));
  document.querySelectorAll(".view").forEach((v) => v.classList.toggle("active", v.id === `view-${view}`));
  refreshView();
}

function refreshView() {
  const views = { curves: () => {}, rollouts: loadRollouts, steps: loadSteps, replays: loadReplays, fleet: loadFleet };
  views[state.view]().catch(showError);
}

function showError(error) {
  $("#summary").innerHTML = `<span class="error">${esc(error.message)}</span>`;
}

// -- summary ---------------------------------------------------------------------------------------

async function loadSummary() {
  const s = await api("api/summary");
  $("#run-name").textContent = s.run;
  // finished: the recipe's last step is on the log; live: the run wrote in the last 15 s
  const live = !s.finished && s.updated_ms && Date.now() - s.updated_ms < 15000;
  const runState = s.finished ? "✓ finished" : live ? "● live" : "○ not moving";
  const drops = Object.entries(s.drops).map(([k, v]) => `${k} ${v}`).join(", ") || "none";
  $("#summary").innerHTML = `<span id="run-state" class="${live ? "live" : "stopped"}">${runState}</span>
    · step <b id="last-step">${s.last_step ?? "–"}</b>${s.planned_steps ? ` of ${s.planned_steps}` : ""} · version ${s.version ?? "–"} · ${s.rollouts} rollouts
    · drops: ${esc(drops)} · ${s.replicas} replica(s)` + (s.unreadable ? ` · <span class="error">${s.unreadable} records unreadable</span>` : "")
    + (s.forgotten ? ` · ${s.forgotten} older rollouts not listed` : "")
    + (s.caught_up ? "" : ` · <span id="reading">reading the log: ${s.behind.toLocaleString()} records to go</span>`);
  if (s.caught_up && state.caughtUp !== true) state.whole = true;  // the curves again, whole: rollouts read after their steps
  state.caughtUp = s.caught_up;
  const select = $("#rollout-filters select[name=environment]");
  for (const env of s.environments) {
    if (![...select.options].some((o) => o.value === env)) select.add(new Option(env, env));
  }
}

// -- curves ----------------------------------------------------------------------------------------

function chart(id, series, data, { time = false } = {}) {
  const el = document.getElementById(id);
  el.dataset.points = String(data[0] ? data[0].length : 0);
  el.dataset.full = String(data[0] ? data[0].filter((_, i) => data.every((values) => values[i] !== null && values[i] !== undefined)).length : 0);
  const existing = state.charts[id];
  if (existing && existing.series.length === series.length + 1) {
    existing.setData(data, true);
    return;
  }
  if (existing) existing.destroy();
  const opts = {
    width: Math.max(el.clientWidth, 480), height: 220,
    scales: { x: { time } },
    series: [{ label: time ? "time" : "step" }, ...series.map((label, i) => ({ label, stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: true }))],
    axes: [{}, { size: 60 }],
    cursor: { drag: { x: true, y: false } },
  };
  state.charts[id] = new uPlot(opts, data, el);
}

function bySteps(rows, pick) {
  return [rows.map((r) => r.step), ...pick.map((f) => rows.map(f))];
}

function drawCurves() {
  const c = state.curves;
  const steps = c.steps;
  const envs = [...new Set(steps.flatMap((r) => Object.keys(r.environments || {})))].sort();
  chart("chart-reward", ["all", ...envs], bySteps(steps, [(r) => r.reward, ...envs.map((e) => (r) => r.environments?.[e]?.reward ?? null)]));
  const terms = [...new Set(steps.flatMap((r) => Object.keys(r.reward_terms || {})))].sort();
  chart("chart-reward-terms", terms.length ? terms : ["(none)"],
        bySteps(steps, terms.length ? terms.map((t) => (r) => r.reward_terms?.[t] ?? null) : [() => null]));
  chart("chart-staleness", ["mean", "max"], bySteps(steps, [(r) => r.staleness_mean, (r) => r.staleness_max]));
  chart("chart-throughput", ["samples/s", "tokens/s ÷ 100"], bySteps(steps, [(r) => r.samples_per_s, (r) => (r.tokens_per_s ?? 0) / 100]));
  chart("chart-loss", ["loss", "grad norm"], bySteps(steps, [(r) => r.loss, (r) => r.grad_norm]));
  const metrics = [...new Set(steps.flatMap((r) => Object.keys(r.loss_metrics || {})))].sort();
  chart("chart-loss-metrics", metrics.length ? metrics : ["(none)"],
        bySteps(steps, metrics.length ? metrics.map((m) => (r) => r.loss_metrics?.[m] ?? null) : [() => null]));
  const groups = [...new Set(c.lag.flatMap((r) => Object.keys(r).filter((k) => k !== "time_ms")))].sort();
  chart("chart-lag", groups.length ? groups : ["(none)"],
        [c.lag.map((r) => r.time_ms / 1000), ...(groups.length ? groups.map((g) => c.lag.map((r) => r[g] ?? null)) : [c.lag.map(() => null)])], { time: true });
  const replicas = [...new Set(c.reloads.map((r) => r.replica))].sort();
  chart("chart-reloads", replicas.length ? replicas : ["(none)"],
        [c.reloads.map((r) => r.time_ms / 1000), ...(replicas.length ? replicas.map((id) => c.reloads.map((r) => (r.replica === id ? r.pause_s : null)))
                                                    : [c.reloads.map(() => null)])], { time: true });
  const reasons = [...new Set(c.drops.flatMap((r) => Object.keys(r).filter((k) => k !== "time_ms")))].sort();
  chart("chart-drops", reasons.length ? reasons : ["(none)"],
        [c.drops.map((r) => r.time_ms / 1000), ...(reasons.length ? reasons.map((k) => c.drops.map((r) => r[k] ?? 0)) : [c.drops.map(() => null)])], { time: true });
}

async function loadCurves() {
  // Every 15th poll takes the whole curves again: rollouts read after their step (a run read from
  // its beginning) fill in the per-environment rewards of steps already drawn. Whether this fetch
  // is whole is decided before it goes out, so a summary read meanwhile cannot turn a partial
  // answer into the whole curves.
  state.polls = (state.polls || 0) + 1;
  const whole = state.whole || state.since === 0 || state.polls % 15 === 0;
  state.whole = false;
  const fresh = await api(`api/curves?since=${whole ? 0 : state.since}`);
  const c = state.curves;
  if (whole) for (const key of ["steps", "drops", "reloads", "lag"]) c[key] = [];
  for (const key of ["steps", "drops", "reloads", "lag"]) c[key].push(...fresh[key]);
  const latest = [c.steps, c.drops, c.reloads, c.lag].map((rows) => (rows.length ? rows[rows.length - 1].time_ms : 0));
  state.since = Math.max(whole ? 0 : state.since, ...latest);
  if (whole || Object.values(fresh).some((rows) => rows.length) || !Object.keys(state.charts).length) drawCurves();
}

// -- rollouts --------------------------------------------------------------------------------------

function filters() {
  return Object.fromEntries(new FormData($("#rollout-filters")).entries());
}

async function loadRollouts() {
  const page = await api(`api/rollouts?${query({ ...filters(), offset: state.rolloutOffset, limit: state.pageSize })}`);
  const body = $("#rollout-table tbody");
  body.innerHTML = page.rollouts.map((r) => `<tr class="rollout${r.rollout_id === state.selected ? " selected" : ""}" data-id="${esc(r.rollout_id)}">
    <td title="${esc(r.rollout_id)}">${esc(r.rollout_id)}</td><td>${esc(r.environment)}</td><td class="num">${num(r.reward)}</td><td class="num">${num(r.advantage)}</td>
    <td>${r.version_min === null ? "–" : r.version_min === r.version_max ? r.version_min : `${r.version_min}–${r.version_max}`}</td>
    <td class="fate-${r.fate.replace(" ", "-")}">${esc(r.fate)}${r.reason ? ` (${esc(r.reason)})` : ""}</td><td>${r.step ?? ""}</td></tr>`).join("");
  const last = Math.min(state.rolloutOffset + state.pageSize, page.total);
  $("#rollouts-page").textContent = page.total ? `${state.rolloutOffset + 1}–${last} of ${page.total}` : "no rollouts match";
}

function tokenColour(token, mode) {
  if (mode === "mask") return token.mask ? "rgba(67,160,71,.25)" : "rgba(120,120,120,.18)";
  if (mode === "logprob") {
    if (token.logprob === null) return "transparent";
    const p = Math.exp(token.logprob);
    return `rgba(229,57,53,${(0.55 * (1 - p)).toFixed(2)})`;
  }
  if (mode === "advantage") {
    if (token.advantage === null) return "transparent";
    const a = Math.max(-1, Math.min(1, token.advantage));
    return a >= 0 ? `rgba(67,160,71,${(0.5 * a).toFixed(2)})` : `rgba(229,57,53,${(-0.5 * a).toFixed(2)})`;
  }
  return token.version === null ? "transparent" : `${PALETTE[token.version % PALETTE.length]}33`;
}

function renderTokens(detail) {
  const mode = state.tokenMode;
  const versions = [...new Set(detail.tokens.map((t) => t.version).filter((v) => v !== null))];
  const legend = mode === "version" ? versions.map((v) => `<span style="background:${PALETTE[v % PALETTE.length]}33">v${v}</span>`).join("")
    : mode === "mask" ? `<span style="background:rgba(67,160,71,.25)">trained (sampled)</span><span style="background:rgba(120,120,120,.18)">not trained (environment, tools)</span>`
    : mode === "logprob" ? "redder: less likely under the sampler" : "green: positive advantage, red: negative";
  return `<div class="legend">${legend}</div><div class="tokens" id="tokens">${detail.tokens.map((t) =>
    `<span class="tok" data-version="${t.version ?? ""}" data-mask="${t.mask}" style="background:${tokenColour(t, mode)}"
      title="id ${t.id} · v${t.version ?? "–"} · logprob ${num(t.logprob)} · ${t.mask ? "trained" : "not trained"}">${esc(t.text)}</span>`).join("")}</div>`;
}

async function openRollout(id) {
  state.selected = id;
  document.querySelectorAll("#rollout-table tr").forEach((tr) => tr.classList.toggle("selected", tr.dataset.id === id));
  const el = $("#rollout-detail");
  el.innerHTML = `<p class="hint">Reading ${esc(id)}…</p>`;
  let d;
  try { d = await api(`api/rollout/${encodeURIComponent(id)}`); } catch (error) { el.innerHTML = `<p class="error">${esc(error.message)}</p>`; return; }
  const r = d.row;
  const fate = r.fate === "dropped" ? `<span class="fate-dropped" id="drop-reason">dropped: ${esc(r.reason)}</span> — ${esc(r.detail)}`
    : r.fate === "trained" ? `<span class="fate-trained">trained in step ${r.step}</span>` : "in flight";
  el.innerHTML = `<h2>${esc(r.rollout_id)}</h2>
    <dl><dt>group</dt><dd>${esc(r.group_id)} (sample ${r.sample_index})</dd><dt>environment</dt><dd>${esc(r.environment)}</dd>
      <dt>fate</dt><dd id="rollout-fate">${fate}</dd>
      <dt>reward</dt><dd>${num(r.reward)} ${Object.entries(d.rewards).map(([k, v]) => `${esc(k)} ${num(v)}`).join(", ")}</dd>
      <dt>scored</dt><dd>${d.scored ? `reward ${num(d.scored.reward)} (group mean ${num(d.scored.group_reward_mean)}), advantage ${num(d.scored.advantage)} · ${esc(d.scored.algorithm)}` : "not scored"}</dd>
      <dt>versions</dt><dd>${d.spans.map((s) => `v${s.version} tokens ${s.start}–${s.end}`).join(", ") || "–"}</dd>
      ${d.error ? `<dt>error</dt><dd class="error">${esc(d.error.kind)}: ${esc(d.error.message)}</dd>` : ""}
      <dt>trace</dt><dd>${d.trace_link ? `<a href="${esc(d.trace_link)}" target="_blank" rel="noopener">${esc(d.trace_id)}</a>` : esc(d.trace_id ?? "–")}</dd></dl>
    <div class="prompt">${esc(d.prompt)}</div>
    <p>Colour tokens by <select id="token-mode">${["version", "mask", "logprob", "advantage"].map((m) => `<option${m === state.tokenMode ? " selected" : ""}>${m}</option>`).join("")}</select></p>
    <div id="token-view">${renderTokens(d)}</div>
    ${d.turns.length ? `<h2>Turns and tool calls</h2>${d.turns.map((t) => `<div class="turn ${esc(t.kind)}"><b>${esc(t.role || t.kind)}</b> ${esc(t.content)}</div>`).join("")}` : ""}
    <h2>Its group</h2>
    <table class="rows" id="group-table"><thead><tr><th>rollout</th><th>reward</th><th>advantage</th><th>fate</th></tr></thead><tbody>
    ${d.group.map((m) => `<tr data-id="${esc(m.rollout_id)}"${m.rollout_id === r.rollout_id ? ' class="selected"' : ""}><td>${esc(m.rollout_id)}</td>
      <td class="num">${num(m.final_reward ?? m.reward)}</td><td class="num">${num(m.advantage)}</td><td class="fate-${m.fate.replace(" ", "-")}">${esc(m.fate)}</td></tr>`).join("")}</tbody></table>`;
  $("#token-mode").addEventListener("change", (e) => { state.tokenMode = e.target.value; $("#token-view").innerHTML = renderTokens(d); });
  $("#group-table tbody").addEventListener("click", (e) => { const tr = e.target.closest("tr"); if (tr) openRollout(tr.dataset.id); });
}

// -- steps -----------------------------------------------------------------------------------------

async function loadSteps() {
  const page = await api(`api/steps?offset=${state.stepOffset}&limit=${state.pageSize}`);
  $("#step-table tbody").innerHTML = page.steps.map((s) => `<tr data-step="${s.step}"><td>${s.step}</td><td>${s.version}</td>
    <td class="num">${num(s.reward)}</td><td class="num">${s.rollouts}</td><td>${s.staleness_max === null ? "–" : `${num(s.staleness_mean, 2)} / ${s.staleness_max}`}</td>
    <td class="num">${num(s.loss, 4)}</td><td>${Object.entries(s.served).map(([id, ms]) => `${esc(id)} +${((ms - s.time_ms) / 1000).toFixed(1)} s`).join(", ") || "–"}</td></tr>`).join("");
  const last = Math.min(state.stepOffset + state.pageSize, page.total);
  $("#steps-page").textContent = page.total ? `${state.stepOffset + 1}–${last} of ${page.total}` : "no steps yet";
}

async function openStep(number) {
  const s = await api(`api/step/${number}`);
  const perEnv = Object.entries(s.environments).map(([e, v]) => `<tr><td>${esc(e)}</td><td class="num">${num(v.reward)}</td><td class="num">${v.rollouts}</td></tr>`).join("");
  const terms = Object.entries(s.reward_terms).map(([k, v]) => `${esc(k)} ${num(v)}`).join(", ") || "–";
  $("#step-detail").innerHTML = `<h2>Step ${s.step} → version ${s.version}</h2>
    <dl><dt>completed</dt><dd>${when(s.time_ms)} (waited ${num(s.wait_s, 1)} s for its batch)</dd><dt>loss</dt><dd>${num(s.loss, 4)} · grad norm ${num(s.grad_norm)}</dd>
      <dt>staleness</dt><dd>mean ${num(s.staleness_mean, 2)}, max ${s.staleness_max ?? "–"}</dd>
      <dt>reward terms</dt><dd>${terms}</dd>
      <dt>samples</dt><dd>${Object.entries(s.samples).map(([k, v]) => `${esc(k)} ${v}`).join(", ") || "–"}</dd>
      <dt>drops</dt><dd>${Object.entries(s.drops).map(([k, v]) => `${esc(k)} ${v}`).join(", ") || "none"}</dd>
      <dt>loss metrics</dt><dd>${Object.entries(s.loss_metrics).map(([k, v]) => `${esc(k)} ${num(v)}`).join(", ") || "–"}</dd>
      <dt>its weights served</dt><dd>${Object.entries(s.served).map(([id, ms]) => `${esc(id)} at ${when(ms)} (+${((ms - s.time_ms) / 1000).toFixed(1)} s)`).join("; ") || "not yet"}</dd></dl>
    <table class="rows"><thead><tr><th>environment</th><th>reward</th><th>rollouts</th></tr></thead><tbody>${perEnv}</tbody></table>
    <h2>Trained (${s.trained_total})</h2>
    <table class="rows" id="step-rollouts"><tbody>${s.trained.map((r) => `<tr data-id="${esc(r.rollout_id)}"><td>${esc(r.rollout_id)}</td><td>${esc(r.environment)}</td>
      <td class="num">${num(r.reward)}</td><td class="num">${num(r.advantage)}</td></tr>`).join("")}</tbody></table>`;
  $("#step-rollouts tbody").addEventListener("click", (e) => { const tr = e.target.closest("tr"); if (tr) { show("rollouts"); openRollout(tr.dataset.id); } });
}

// -- replays and fleet -----------------------------------------------------------------------------

async function loadReplays() {
  const names = await api("api/replays");
  $("#replay-list").innerHTML = names.map((n) => `<li data-name="${esc(n)}">${esc(n)}</li>`).join("") || "<li>no replays of this run yet</li>";
}

async function openReplay(name) {
  const el = $("#replay-detail");
  el.innerHTML = `<p class="hint">Comparing ${esc(name)} with the record…</p>`;
  const r = await api(`api/replay/${encodeURIComponent(name)}`);
  el.innerHTML = `<h2>${esc(r.name)} against the record</h2>
    <p>${r.identical + r.changed} rollouts scored in both: <b id="replay-changed">${r.changed}</b> changed, ${r.identical} identical;
      ${r.only_recorded} only as recorded, ${r.only_replayed} only in the replay; ${r.zero_signal_groups} groups lost all signal.</p>
    <table class="rows"><thead><tr><th>environment</th><th>rollouts</th><th>reward before → after</th><th>advantage before → after</th><th>sign flips</th></tr></thead><tbody>
    ${r.environments.map((e) => `<tr><td>${esc(e.environment)}</td><td class="num">${e.rollouts}</td><td>${num(e.reward_before)} → ${num(e.reward_after)}</td>
      <td>${num(e.advantage_before)} → ${num(e.advantage_after)}</td><td class="num">${e.sign_flips}</td></tr>`).join("")}</tbody></table>
    <h2>Largest changes</h2><table class="rows" id="replay-changes"><thead><tr><th>rollout</th><th>advantage before</th><th>after</th></tr></thead><tbody>
    ${r.largest.map((c) => `<tr data-id="${esc(c.rollout_id)}"${c.sign_flip ? ' class="flip"' : ""}><td>${esc(c.rollout_id)}</td><td class="num">${num(c.before)}</td>
      <td class="num">${num(c.after)}${c.sign_flip ? " (sign flip)" : ""}</td></tr>`).join("")}</tbody></table>`;
  $("#replay-changes tbody").addEventListener("click", (e) => { const tr = e.target.closest("tr"); if (tr) { show("rollouts"); openRollout(tr.dataset.id); } });
}

async function loadFleet() {
  const f = await api("api/fleet");
  $("#replica-table tbody").innerHTML = f.replicas.map((r) => `<tr><td>${esc(r.replica)}</td><td>${esc(r.state)}</td><td>${r.serving ?? "–"}</td>
    <td>${r.requested ?? "–"}</td><td>${esc(r.transfer)}</td><td>${when(r.time_ms)}</td><td>${esc(r.reason ?? "")}</td></tr>`).join("");
  $("#version-table tbody").innerHTML = f.versions.map((v) => `<tr><td>${v.version}</td><td>${esc(v.kind)}</td>
    <td class="num">${(v.size_bytes / 1e6).toFixed(2)} MB</td><td class="num">${(v.full_size_bytes / 1e6).toFixed(2)} MB</td><td>${when(v.time_ms)}</td></tr>`).join("");
  $("#decision-table tbody").innerHTML = f.decisions.map((d) => `<tr><td>${when(d.time_ms)}</td><td>${esc(d.reason)}</td><td>${d.stable}</td>
    <td>${d.canary === null ? "–" : `${d.canary} (${Math.round(d.canary_share * 100)}%)`}</td><td>${esc(d.by)}</td><td>${esc(d.note)}</td></tr>`).join("") || `<tr><td colspan="6">no decisions: nothing promoted yet</td></tr>`;
}

// -- wiring ----------------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("nav button").forEach((b) => b.addEventListener("click", () => show(b.dataset.view)));
  $("#rollout-filters").addEventListener("submit", (e) => { e.preventDefault(); state.rolloutOffset = 0; loadRollouts().catch(showError); });
  $("#rollout-table tbody").addEventListener("click", (e) => { const tr = e.target.closest("tr"); if (tr) openRollout(tr.dataset.id); });
  $("#rollouts-prev").addEventListener("click", () => { state.rolloutOffset = Math.max(0, state.rolloutOffset - state.pageSize); loadRollouts(); });
  $("#rollouts-next").addEventListener("click", () => { state.rolloutOffset += state.pageSize; loadRollouts(); });
  $("#step-table tbody").addEventListener("click", (e) => { const tr = e.target.closest("tr"); if (tr) openStep(tr.dataset.step).catch(showError); });
  $("#steps-prev").addEventListener("click", () => { state.stepOffset = Math.max(0, state.stepOffset - state.pageSize); loadSteps(); });
  $("#steps-next").addEventListener("click", () => { state.stepOffset += state.pageSize; loadSteps(); });
  $("#replay-list").addEventListener("click", (e) => { const li = e.target.closest("li[data-name]"); if (li) openReplay(li.dataset.name).catch(showError); });
  // One poll at a time, the summary before the curves: a slow answer never overlaps the next poll.
  const tick = async () => {
    try {
      await loadSummary();
      await loadCurves();
    } catch (err) {
      showError(err);
    }
    setTimeout(tick, 2000);
  };
  tick();
  setInterval(() => { if (state.view !== "curves") refreshView(); }, 5000);
  const fromHash = () => { const view = location.hash.replace("#", ""); if (document.getElementById(`view-${view}`)) show(view); };
  window.addEventListener("hashchange", fromHash);
  fromHash();
});
