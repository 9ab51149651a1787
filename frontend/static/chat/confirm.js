// A confirmation asked in the page (a modal <dialog>), not with the browser's confirm():
// it can be styled, read by screen readers like the rest of the page, and does not block
// the tab's scripts (streams go on while it is open).

import { el } from "./dom.js";

/** Ask `question`; resolves true when the person picks `action`, false otherwise. */
export function confirmAction(question, action) {
  const text = el("p", { class: "confirm-text", dir: "auto" }, question);
  const cancel = el("button", { type: "button", class: "button", value: "cancel" }, "Cancel");
  const accept = el("button", { type: "button", class: "button danger", value: "accept" }, action);
  const dialog = el(
    "dialog",
    { class: "confirm", "aria-label": action },
    text,
    el("div", { class: "confirm-actions" }, cancel, accept),
  );
  document.body.append(dialog);
  return new Promise((resolve) => {
    const answer = (value) => {
      dialog.close();
      dialog.remove();
      resolve(value);
    };
    cancel.addEventListener("click", () => answer(false));
    accept.addEventListener("click", () => answer(true));
    dialog.addEventListener("cancel", (e) => {
      e.preventDefault();
      answer(false);
    });
    dialog.showModal();
    cancel.focus();
  });
}
