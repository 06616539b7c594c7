// spawnkit live run view: applies batches of changes as they arrive, never the whole
// transcript. Keeps at most MAX_ROWS tool-call rows and MAX_TEXT characters in the DOM.
const MAX_ROWS = 1000;
const MAX_TEXT = 40000;

function tokens(n) {
  return (n || 0).toLocaleString("en-US");
}

function statusLine(s, elapsed) {
  const parts = [];
  const mark = { success: "✓", failed: "✗", cancelled: "■", crashed: "✗" }[s.state] || "●";
  parts.push(`${mark} ${s.state}`);
  if (s.state === "queued" && s.queue_position) parts.push(`queue position ${s.queue_position}`);
  parts.push(`${elapsed.toFixed(1)} s`);
  if (s.turns != null) parts.push(`${s.turns} turns`);
  parts.push(`${s.tool_calls} tool call${s.tool_calls === 1 ? "" : "s"}`);
  parts.push(`${tokens(s.input_tokens)} in / ${tokens(s.output_tokens)} out tokens`);
  if (s.cost_usd != null) parts.push(`$${s.cost_usd.toFixed(4)}`);
  const who = [s.butler, s.runtime, s.model].filter(Boolean).join(" · ");
  return (who ? who + " — " : "") + parts.join(" · ");
}

function render({ model, el }) {
  el.classList.add("spawnkit-run");
  const head = document.createElement("div");
  head.className = "sk-status";
  const rows = document.createElement("div");
  rows.className = "sk-rows";
  const hiddenNote = document.createElement("div");
  hiddenNote.className = "sk-hidden";
  const text = document.createElement("div");
  text.className = "sk-text";
  const error = document.createElement("div");
  error.className = "sk-error";
  el.append(head, hiddenNote, rows, text, error);

  const byId = new Map();
  let seq = -1;
  let status = null;
  let elapsedBase = 0;
  let elapsedAt = performance.now();
  let textLength = 0;
  let hidden = 0;

  function showStatus() {
    if (!status) return;
    const live = status.state === "running" || status.state === "queued" || status.state === "starting";
    const elapsed = live ? elapsedBase + (performance.now() - elapsedAt) / 1000 : elapsedBase;
    head.textContent = statusLine(status, elapsed);
    head.dataset.state = status.state;
    error.textContent = status.error ? `error: ${status.error}` : "";
  }

  function setStatus(s) {
    status = s;
    elapsedBase = s.elapsed_s || 0;
    elapsedAt = performance.now();
    showStatus();
  }

  function fillRow(d, r) {
    const where = r.server ? `${r.server}.` : "";
    const mark = { ok: "✓", error: "✗" }[r.status] || "…";
    const duration = r.duration_ms != null ? ` · ${r.duration_ms} ms` : "";
    const summary = d.querySelector("summary");
    summary.textContent = `${mark} ${where}${r.tool}  ${r.input.slice(0, 160)}${duration}`;
    d.dataset.status = r.status;
    d.querySelector(".sk-input").textContent = r.input;
    d.querySelector(".sk-output").textContent = r.output == null ? "(running…)" : r.output || "(no output)";
  }

  function putRow(r) {
    let d = byId.get(r.id);
    if (!d) {
      d = document.createElement("details");
      d.className = "sk-row";
      d.dataset.id = r.id;
      const summary = document.createElement("summary");
      const input = document.createElement("pre");
      input.className = "sk-input";
      const output = document.createElement("pre");
      output.className = "sk-output";
      d.append(summary, input, output);
      rows.append(d);
      byId.set(r.id, d);
      while (byId.size > MAX_ROWS) {
        const first = rows.firstElementChild;
        byId.delete(first.dataset.id);
        first.remove();
        hidden += 1;
      }
    }
    fillRow(d, r);
  }

  function appendText(t) {
    if (!t) return;
    text.append(document.createTextNode(t));
    textLength += t.length;
    while (textLength > MAX_TEXT && text.firstChild) {
      textLength -= text.firstChild.textContent.length;
      text.firstChild.remove();
    }
  }

  function showHidden(dropped) {
    const total = hidden + (dropped || 0);
    hiddenNote.textContent = total ? `… ${total} earlier tool calls not shown` : "";
  }

  function applySnapshot(snap) {
    if (!snap || snap.seq === undefined || snap.seq <= seq) return;
    seq = snap.seq;
    rows.replaceChildren();
    byId.clear();
    hidden = 0;
    (snap.rows || []).forEach(putRow);
    text.replaceChildren();
    textLength = 0;
    appendText(snap.text);
    setStatus(snap.status);
    showHidden(snap.dropped_rows);
  }

  function applyBatch(b) {
    // A view opened late may have missed batches; the next snapshot repairs it.
    if (b.seq <= seq) return;
    seq = b.seq;
    b.rows.forEach(putRow);
    appendText(b.text);
    setStatus(b.status);
    showHidden(b.dropped_rows);
  }

  applySnapshot(model.get("snapshot"));
  const onSnapshot = () => applySnapshot(model.get("snapshot"));
  const onMessage = (msg) => {
    if (msg && msg.kind === "batch") applyBatch(msg);
  };
  model.on("change:snapshot", onSnapshot);
  model.on("msg:custom", onMessage);
  const timer = setInterval(showStatus, 500);
  return () => {
    clearInterval(timer);
    model.off("change:snapshot", onSnapshot);
    model.off("msg:custom", onMessage);
  };
}

export default { render };
