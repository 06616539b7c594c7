// The dashboard's table of recent sessions: one row per session, newest first; a click on a
// row selects it (the kernel then shows that run's transcript under the table).
function render({ model, el }) {
  el.classList.add("spawnkit-sessions");
  const table = document.createElement("table");
  table.className = "sk-sessions";
  el.append(table);
  const columns = [
    ["started", "started"], ["butler", "butler"], ["runtime", "runtime"], ["status", "status"],
    ["source", "source"],
    ["tools", "tools"], ["duration", "time"], ["cost", "cost"], ["prompt", "prompt"],
  ];

  function draw() {
    const rows = model.get("rows") || [];
    const selected = model.get("selected");
    const head = document.createElement("thead");
    const tr = document.createElement("tr");
    columns.forEach(([, label]) => {
      const th = document.createElement("th");
      th.textContent = label;
      tr.append(th);
    });
    head.append(tr);
    const body = document.createElement("tbody");
    rows.forEach((r) => {
      const row = document.createElement("tr");
      row.dataset.id = r.id;
      row.dataset.status = r.status;
      row.title = `session ${r.id}: click for its transcript`;
      if (r.id === selected) row.classList.add("sk-selected");
      columns.forEach(([key]) => {
        const td = document.createElement("td");
        td.className = `sk-col-${key}`;
        if (key === "status") {
          const mark = document.createElement("span");
          mark.className = "sk-mark";
          mark.textContent = r.mark;
          td.append(mark, document.createTextNode(` ${r.status}`));
        } else td.textContent = r[key];
        row.append(td);
      });
      row.addEventListener("click", () => {
        model.set("selected", r.id === model.get("selected") ? "" : r.id);
        model.save_changes();
      });
      body.append(row);
    });
    table.replaceChildren(head, body);
    if (!rows.length) {
      const empty = document.createElement("caption");
      empty.textContent = "no sessions yet";
      table.append(empty);
    }
  }

  draw();
  model.on("change:rows", draw);
  model.on("change:selected", draw);
  return () => {
    model.off("change:rows", draw);
    model.off("change:selected", draw);
  };
}

export default { render };
