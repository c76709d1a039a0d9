// agentrl view: an episode page's fork controls and resume marks (app.js calls these).
// Text goes in with textContent only (el() of app.js).
"use strict";

const FORK_HEADER = "X-Agentrl-Fork";

async function features() {
  if (typeof BUNDLE !== "undefined" && BUNDLE) return { fork: false };
  try { return await api("features", {}); } catch (e) { return { fork: false }; }
}

function forkCommand(ep, turn) {
  const attempt = ep.attempts.length > 1 ? ` --attempt ${ep.attempt}` : "";
  return `agentrl replay ${ep.run_dir || "RUN_DIR"} '${ep.episode_id}' --fork-at ${turn}${attempt}`;
}

// With --allow-fork: a "fork here" button on each assistant turn of an ended episode.
// Without: one line that says how to fork from the CLI.
async function forkControls(run, ep, box) {
  if (ep.unfinished) return;
  const allowed = (await features()).fork;
  const turns = box.querySelectorAll(".msg.role-assistant[data-turn]");
  if (!allowed) {
    const hint = el("p", { id: "fork-hint", class: "muted" },
      "fork from a turn: ", el("code", {}, forkCommand(ep, "TURN")),
      " (or start the viewer with --allow-fork to fork from this page; it starts an inference engine)");
    box.insertBefore(hint, box.firstChild);
    return;
  }
  const progress = el("div", { id: "fork-progress", class: "fork-progress" });
  box.insertBefore(progress, box.firstChild);
  for (const node of turns) {
    const turn = Number(node.dataset.turn);
    node.querySelector(".role").appendChild(el("button", {
      type: "button", class: "fork-button", "data-turn": turn, title: forkCommand(ep, turn),
      onclick: () => startFork(run, ep, turn, progress),
    }, "fork here"));
  }
}

async function startFork(run, ep, turn, progress) {
  const body = { run, id: ep.episode_id, attempt: ep.attempt, turn };
  const response = await fetch("api/fork", {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json", [FORK_HEADER]: "1" },
    body: JSON.stringify(body),
  });
  const job = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) {
    progress.replaceChildren(el("p", { class: "error" }, job.error || response.statusText));
    return;
  }
  const id = routeId;
  const tick = async () => {
    if (id !== routeId) return;
    let now;
    try { now = await api("fork", { job: job.job }); } catch (e) {
      progress.replaceChildren(el("p", { class: "error" }, e.message));
      return;
    }
    if (id !== routeId) return;
    showFork(run, now, progress);
    if (now.state === "running") setTimeout(tick, 1000);
    else if (now.state === "done") location.hash = "/episode?" + qs({ run, id: now.fork_id });
  };
  showFork(run, job, progress);
  tick();
}

function showFork(run, job, progress) {
  const head = el("div", {}, el("strong", {}, `fork of turn ${job.turn}: `),
    el("span", { id: "fork-state" }, job.state),
    job.fork_id ? [" · ", link(job.fork_id, "/episode?" + qs({ run, id: job.fork_id }))] : "");
  progress.replaceChildren(head, el("pre", { class: "fork-log" }, job.lines.slice(-12).join("\n")));
}

// A mark before the first token of each resumed part (and at a checkpoint's end).
const RESUME_WHY = {
  "weight publish": "paused for a weight publish, checkpointed, resumed from its exact prefix",
  "turn start": "the policy changed between turns (a weight publish while it was in flight)",
  "checkpoint": "resumed from its checkpoint (after a crash: --resume), exact prefix",
  "checkpointed": "checkpointed here: a resume continues from this token",
};

function resumeLabel(r) {
  const versions = r.after === null ? `version ${r.before}` : `version ${r.before} → ${r.after}`;
  return `⏸ ${r.why} · turn ${r.turn} · token ${r.token} · ${versions}`;
}

function resumeMarks(ep) {
  // Marks inside the token view, and a list above it; each names token, turn and versions.
  for (const r of ep.resumes) {
    const nodes = ep.nodes[r.segment];
    const mark = el("span", { class: "resume-mark", "data-token": r.token, "data-segment": r.segment,
      "data-turn": r.turn, "data-before": r.before, "data-after": r.after, "data-why": r.why,
      title: RESUME_WHY[r.why] || r.why }, resumeLabel(r));
    if (r.token < nodes.length) nodes[r.token].before(mark);
    else if (nodes.length) nodes[nodes.length - 1].after(mark);
  }
  if (!ep.resumes.length) return "";
  return el("div", { id: "resumes" }, el("strong", {}, `resumed within this attempt (${ep.resumes.length}): `),
    el("ul", {}, ep.resumes.map((r) => el("li", { class: "resume-item", "data-token": r.token },
      resumeLabel(r), el("span", { class: "muted" }, " — " + (RESUME_WHY[r.why] || r.why))))));
}
