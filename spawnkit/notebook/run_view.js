// spawnkit's live run view. The kernel sends batches of changed transcript items (assistant
// text as HTML, tool-call rows) and the header; this file only places them in the DOM, in
// order, and never re-renders the whole transcript. The structure matches static_view.py,
// which writes the same view as fixed HTML for saved notebooks.
const MAX_ITEMS = 1000;
const FOLLOW_SLACK_PX = 24;

function node(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text != null) e.textContent = text;
  return e;
}

function formatDuration(ms) {
  if (ms == null) return "";
  if (ms < 1000) return `${Math.floor(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  const s = Math.floor(ms / 1000);
  return `${Math.floor(s / 60)} min ${s % 60} s`;
}

function button(label, cls, title) {
  const b = node("button", `sk-button ${cls}`, label);
  b.type = "button";
  if (title) b.title = title;
  return b;
}

// One file's diff (FileDiff.to_dict in spawnkit/edits.py), as static_view.diff_html writes it.
const LINE_KINDS = { "+": "add", "-": "del", "@": "hunk" };

function diffNode(diff) {
  const box = node("div", "sk-diff");
  const head = node("div", "sk-diff-head");
  head.append(node("span", "sk-diff-path", diff.path));
  if (diff.lines.length) {
    head.append(" ", node("span", "sk-add", `+${diff.added}`));
    head.append(" ", node("span", "sk-del", `-${diff.removed}`));
  }
  if (diff.note) head.append(" ", node("span", "sk-diff-note", diff.note));
  box.append(head);
  if (diff.lines.length) {
    const lines = node("div", "sk-diff-lines");
    for (const line of diff.lines) {
      const row = node("div", "sk-dl", line || " ");
      row.dataset.kind = LINE_KINDS[line[0]] || "ctx";
      lines.append(row);
    }
    box.append(lines);
  }
  if (diff.more) {
    const s = diff.more === 1 ? "" : "s";
    box.append(node("div", "sk-more", `… ${diff.more.toLocaleString("en-US")} more line${s}`));
  }
  return box;
}

// An edit's row shows its diffs instead of its input (redrawn only when they change).
function fillDiffs(d, r) {
  const diffs = r.diffs || [];
  const key = JSON.stringify(diffs);
  if (d._diffs === key) return;
  d._diffs = key;
  d.querySelector(".sk-diffs").replaceChildren(...diffs.map(diffNode));
  d.querySelector(".sk-input-label").hidden = diffs.length > 0;
  d.querySelector(".sk-input").hidden = diffs.length > 0;
}

// Stop: cancels this run only. While a cell blocks on the run ("foreground") the kernel
// reads no widget message, so the button interrupts the kernel, whose executing cell is
// this run's wait; otherwise the kernel gets a "stop" message. Shown while the run is live.
function stopButton(model) {
  const stop = button("Stop", "sk-stop", "stop this run (recorded as cancelled)");
  stop.hidden = true;
  stop.addEventListener("click", async () => {
    stop.disabled = true;
    stop.textContent = "Stopping…";
    const kernel = model.widget_manager && model.widget_manager.kernel;
    if (!model.get("foreground")) {
      model.send({ kind: "stop" });
    } else if (kernel && kernel.interrupt) {
      await kernel.interrupt();
    } else {
      // A frontend that lends widgets no kernel (the message would wait for the cell).
      stop.textContent = "Use the kernel's Interrupt";
    }
  });
  const show = (live) => {
    stop.hidden = !live;
  };
  return { stop, show };
}

// The turns this run continues (%%spawn --continue/--resume): fixed HTML the kernel wrote,
// collapsed above the run's own.
function earlierTurns(model) {
  const box = node("div", "sk-earlier-turns");
  const show = () => {
    box.innerHTML = model.get("earlier") || "";
  };
  show();
  model.on("change:earlier", show);
  return box;
}

function render({ model, el }) {
  el.classList.add("spawnkit-run");
  const head = node("div", "sk-head");
  const mark = node("span", "sk-mark");
  const state = node("span", "sk-state");
  const who = node("span", "sk-who");
  const waiting = node("span", "sk-waiting");
  const figures = node("span", "sk-figures");
  const elapsed = node("span", "sk-elapsed");
  const stopper = stopButton(model);
  head.append(mark, state, who, waiting, figures, elapsed, stopper.stop);
  const timing = node("div", "sk-timing");

  const toolbar = node("div", "sk-toolbar");
  const expand = button("Expand all", "sk-expand");
  const collapse = button("Collapse all", "sk-collapse");
  const filterLabel = node("label", "sk-filter");
  const filter = document.createElement("input");
  filter.type = "checkbox";
  filterLabel.append(filter, document.createTextNode(" failures only"));
  const follow = button("Following", "sk-follow", "keep the newest row in view");
  toolbar.append(expand, collapse, filterLabel, follow);

  const hiddenNote = node("div", "sk-hidden");
  const transcript = node("div", "sk-transcript");
  const hint = node("div", "sk-hint");
  const error = node("div", "sk-error");
  const foot = node("div", "sk-foot");
  el.append(earlierTurns(model), head, timing, toolbar, hiddenNote, transcript, hint, error, foot);

  const byId = new Map();
  const waiters = new Map();
  let seq = -1;
  let header = null;
  let receivedAt = performance.now();
  let removed = 0;
  let following = true;
  let autoScrollTop = -1;

  // -- header -------------------------------------------------------------------------

  function showHeader() {
    if (!header) return;
    let ms = header.elapsed_s == null ? null : header.elapsed_s * 1000;
    if (ms != null && header.clock) ms += performance.now() - receivedAt;
    head.dataset.state = header.state;
    mark.textContent = header.mark;
    state.textContent = header.state;
    who.textContent = header.who || "";
    waiting.textContent = header.waiting || "";
    figures.textContent = header.figures.join(" · ");
    elapsed.textContent = formatDuration(ms);
    timing.textContent = header.timing || "";
    hint.textContent = header.hint || "";
    error.textContent = header.error || "";
    foot.textContent = header.session_id ? `session ${header.session_id}` : "";
    el.dataset.failedTools = header.failed_tools;
    stopper.show(header.live);
  }

  function setHeader(h) {
    header = h;
    receivedAt = performance.now();
    showHeader();
  }

  // -- items --------------------------------------------------------------------------

  function fullOutput(id) {
    return new Promise((resolve) => {
      waiters.set(id, resolve);
      model.send({ kind: "full_output", id });
    });
  }

  async function copyText(row, r, copy) {
    const text = r.output_more ? await fullOutput(r.id) : r.output || "";
    try {
      await navigator.clipboard.writeText(text || "");
      copy.textContent = "Copied";
    } catch (err) {
      const range = document.createRange();
      range.selectNodeContents(row.querySelector(".sk-output"));
      const selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      copy.textContent = "Selected: press Ctrl-C";
    }
    setTimeout(() => (copy.textContent = "Copy"), 1500);
  }

  function newTool(r) {
    const d = node("details", "sk-item sk-tool");
    const summary = node("summary");
    summary.append(
      node("span", "sk-mark"),
      node("span", "sk-label"),
      node("span", "sk-summary"),
      node("span", "sk-dur"),
      node("span", "sk-result"),
    );
    const body = node("div", "sk-body");
    const outputLabel = node("div", "sk-section sk-output-label");
    const actions = node("div", "sk-actions");
    const more = button("Show all", "sk-show-all", "show the whole output");
    const copy = button("Copy", "sk-copy", "copy the whole output");
    actions.append(more, copy);
    body.append(
      node("div", "sk-diffs"),
      node("div", "sk-section sk-input-label", "input"),
      node("pre", "sk-input"),
      outputLabel,
      node("pre", "sk-output"),
      actions,
    );
    d.append(summary, body);
    if (r.diffs && r.diffs.length) d.open = true; // an edit shows its diff unasked
    more.addEventListener("click", async () => {
      more.disabled = true;
      const text = await fullOutput(r.id);
      d.dataset.full = "1";
      d.querySelector(".sk-output").textContent = text == null ? "(no longer kept)" : text;
      more.hidden = true;
    });
    copy.addEventListener("click", () => copyText(d, d._row, copy));
    return d;
  }

  function fillTool(d, r) {
    d._row = r;
    const mark = { ok: "✓", error: "✗" }[r.status] || "…";
    const summary = d.firstElementChild;
    summary.querySelector(".sk-mark").textContent = mark;
    summary.querySelector(".sk-label").textContent = r.label;
    summary.querySelector(".sk-summary").textContent = r.summary;
    summary.querySelector(".sk-dur").textContent = r.duration || "";
    summary.querySelector(".sk-result").textContent = r.result == null ? "running…" : r.result;
    d.dataset.status = r.status;
    d.querySelector(".sk-input").textContent = r.input;
    fillDiffs(d, r);
    const done = r.output != null;
    const lines = `${r.output_lines} line${r.output_lines === 1 ? "" : "s"}`;
    d.querySelector(".sk-output-label").textContent = done ? `output · ${lines}` : "output";
    if (!d.dataset.full) {
      d.querySelector(".sk-output").textContent = done ? r.output || "(no output)" : "(running…)";
    }
    const more = d.querySelector(".sk-show-all");
    more.hidden = !r.output_more || !!d.dataset.full;
    more.textContent = `Show all (${r.output_more.toLocaleString("en-US")} more characters)`;
    d.querySelector(".sk-copy").hidden = !done;
  }

  // A tool call of [butler.permissions] ask waiting for an answer: its tool, its input,
  // Allow and Deny. The answer goes to the kernel; the card shows the decision once the
  // run has it (the next batch).
  function newApproval(r) {
    const d = node("div", "sk-item sk-approval");
    const title = node("div", "sk-approval-title");
    const input = node("pre", "sk-input");
    const actions = node("div", "sk-actions");
    const allow = button("Allow", "sk-allow", "let this tool call run");
    const deny = button("Deny", "sk-deny", "refuse it: the agent is told");
    actions.append(allow, deny);
    d.append(title, input, actions);
    const answer = (allowed) => {
      allow.disabled = deny.disabled = true;
      model.send({ kind: "permission", id: d._row.call_id, allowed });
    };
    allow.addEventListener("click", () => answer(true));
    deny.addEventListener("click", () => answer(false));
    return d;
  }

  function fillApproval(d, r) {
    d._row = r;
    d.dataset.state = r.state;
    d.querySelector(".sk-approval-title").textContent = r.text;
    d.querySelector(".sk-input").textContent = r.input;
    const open = r.state === "waiting";
    d.querySelector(".sk-input").hidden = !open;
    d.querySelector(".sk-actions").hidden = !open || r.below;
  }

  function putItem(r) {
    let d = byId.get(r.id);
    if (!d) {
      if (r.kind === "text") {
        d = node("div", "sk-item sk-text jp-RenderedHTMLCommon");
      } else if (r.kind === "notice") {
        d = node("div", "sk-item sk-notice"); // a refused connection, as plain text
      } else if (r.kind === "approval") {
        d = newApproval(r);
      } else {
        d = newTool(r);
        el.dataset.tools = "1";
      }
      d.dataset.id = r.id;
      transcript.append(d);
      byId.set(r.id, d);
      while (byId.size > MAX_ITEMS) {
        const first = transcript.firstElementChild;
        byId.delete(first.dataset.id);
        first.remove();
        removed += 1;
      }
    }
    if (r.kind === "text") d.innerHTML = r.html; // HTML from Markdown, raw tags escaped
    else if (r.kind === "notice") d.textContent = `⛔ ${r.text}`;
    else if (r.kind === "approval") fillApproval(d, r);
    else fillTool(d, r);
  }

  function showHidden(dropped) {
    const total = removed + (dropped || 0);
    hiddenNote.textContent = total ? `… ${total} earlier items not shown` : "";
  }

  // -- following the newest row -------------------------------------------------------

  function scrollToEnd() {
    if (!following) return;
    transcript.scrollTop = transcript.scrollHeight;
    autoScrollTop = transcript.scrollTop;
  }

  function setFollowing(on) {
    following = on;
    follow.classList.toggle("sk-on", on);
    follow.textContent = on ? "Following" : "Follow";
    if (on) scrollToEnd();
  }

  transcript.addEventListener("scroll", () => {
    if (Math.abs(transcript.scrollTop - autoScrollTop) < 2) return;
    const gap = transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight;
    setFollowing(gap < FOLLOW_SLACK_PX);
  });
  follow.addEventListener("click", () => setFollowing(!following));
  expand.addEventListener("click", () => {
    transcript.querySelectorAll("details").forEach((d) => (d.open = true));
  });
  collapse.addEventListener("click", () => {
    transcript.querySelectorAll("details").forEach((d) => (d.open = false));
  });
  filter.addEventListener("change", () => {
    el.classList.toggle("sk-failures-only", filter.checked);
  });
  setFollowing(true);

  // -- messages -----------------------------------------------------------------------

  function applySnapshot(snap) {
    if (!snap || snap.seq === undefined || snap.seq <= seq || !snap.header) return;
    seq = snap.seq;
    transcript.replaceChildren();
    byId.clear();
    removed = 0;
    (snap.items || []).forEach(putItem);
    setHeader(snap.header);
    showHidden(snap.dropped);
    scrollToEnd();
  }

  function applyBatch(b) {
    // A view opened late may have missed batches; the next snapshot repairs it.
    if (b.seq <= seq) return;
    seq = b.seq;
    b.items.forEach(putItem);
    setHeader(b.header);
    showHidden(b.dropped);
    if (b.items.length) scrollToEnd();
  }

  applySnapshot(model.get("snapshot"));
  const onSnapshot = () => applySnapshot(model.get("snapshot"));
  const onMessage = (msg) => {
    if (!msg) return;
    if (msg.kind === "batch") applyBatch(msg);
    else if (msg.kind === "full_output" && waiters.has(msg.id)) {
      waiters.get(msg.id)(msg.text);
      waiters.delete(msg.id);
    }
  };
  model.on("change:snapshot", onSnapshot);
  model.on("msg:custom", onMessage);
  const timer = setInterval(() => header && header.clock && showHeader(), 250);
  return () => {
    clearInterval(timer);
    model.off("change:snapshot", onSnapshot);
    model.off("msg:custom", onMessage);
  };
}

export default { render };
