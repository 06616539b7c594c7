// A prompt field and its button. A submit (the button, Enter, or Ctrl+Enter in a multi-line
// field) sends the field's text in the message itself: ipywidgets holds state syncs back
// while one is in flight, so the kernel's copy of `value` may lag what the field shows.
function render({ model, el }) {
  el.classList.add("spawnkit-prompt-box");
  const field = document.createElement(model.get("multiline") ? "textarea" : "input");
  if (field.tagName === "INPUT") field.type = "text";
  field.className = "sk-prompt-field";
  const button = document.createElement("button");
  button.type = "button";
  button.className = "jupyter-button widget-button mod-primary sk-prompt-submit";
  el.append(field, button);

  function draw() {
    if (field.value !== model.get("value")) field.value = model.get("value");
    field.placeholder = model.get("placeholder");
    button.textContent = model.get("label");
    button.disabled = model.get("disabled");
  }

  function submit() {
    if (model.get("disabled")) return;
    model.send({ event: "submit", text: field.value });
  }

  // The kernel took a submit (clear_on_submit): empty the field unless typing went on.
  function onMessage(msg) {
    if (msg && msg.event === "accepted" && field.value === msg.text) {
      field.value = "";
      model.set("value", "");
      model.save_changes();
    }
  }

  field.addEventListener("input", () => {
    model.set("value", field.value);
    model.save_changes();
  });
  field.addEventListener("keydown", (event) => {
    const multiline = field.tagName === "TEXTAREA";
    if (event.key === "Enter" && (!multiline || event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      submit();
    }
  });
  button.addEventListener("click", submit);
  draw();
  model.on("change", draw);
  model.on("msg:custom", onMessage);
  return () => {
    model.off("change", draw);
    model.off("msg:custom", onMessage);
  };
}

export default { render };
