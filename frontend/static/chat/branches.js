// A conversation's versions: Regenerate on every answer, Edit on every question (in place:
// Save and Send, or Cancel), and `‹ n / m ›` to step between the versions of a message
// (its siblings: the answers to one question, the edits of one question).

import { composing, el } from "./dom.js";

function button(text, label, enabled, onClick) {
  const node = el("button", { type: "button", class: "button small action", "aria-label": label }, text);
  node.disabled = !enabled;
  node.addEventListener("click", onClick);
  return node;
}

/** `‹ n / m ›` for a message with other versions, else null. */
function versions(message, switchTo) {
  const siblings = message.siblings || [message.id];
  if (siblings.length < 2) return null;
  const at = siblings.indexOf(message.id);
  return el(
    "span",
    { class: "versions", role: "group", "aria-label": "Versions" },
    button("‹", "Previous version", at > 0, () => switchTo(siblings[at - 1], message.id)),
    el("span", { class: "version-count" }, `${at + 1} / ${siblings.length}`),
    button("›", "Next version", at < siblings.length - 1, () => switchTo(siblings[at + 1], message.id)),
  );
}

/** The question's text swapped for an editor until it is sent or cancelled. */
function startEditing(node, message, edit) {
  const bubble = node.querySelector(".bubble");
  if (!bubble || node.querySelector(".editor")) return;
  // As many lines as the question has, from three to twelve (then it scrolls).
  const rows = Math.min(Math.max(message.content.split("\n").length, 3), 12);
  const field = el("textarea", { class: "edit-input", "aria-label": "Edit your message", rows });
  field.value = message.content;
  const save = el("button", { type: "button", class: "button primary small" }, "Save and Send");
  const cancel = el("button", { type: "button", class: "button small" }, "Cancel");
  const editor = el("div", { class: "editor" }, field, el("div", { class: "editor-actions" }, save, cancel));
  const stopEditing = () => {
    editor.remove();
    bubble.hidden = false;
  };
  cancel.addEventListener("click", stopEditing);
  save.addEventListener("click", async () => {
    if (!field.value.trim()) return;
    save.disabled = true;
    if (await edit(message.id, field.value)) stopEditing();
    else save.disabled = false;
  });
  field.addEventListener("keydown", (e) => {
    if (composing(e)) return; // its Esc drops the word: not the edit
    if (e.key === "Escape") {
      e.stopPropagation(); // this field's: not the page's Esc, which stops the answer
      stopEditing();
    }
  });
  bubble.hidden = true;
  bubble.after(editor);
  field.focus();
}

/**
 * Fill a message's action bar: Regenerate (answers) or Edit (questions) in its slot, and
 * the versions switcher. `actions`: `regenerate(id)`, `edit(id, content)` (true when sent),
 * `switchTo(id, from)` (`from`: the version shown). Safe to call again on the same node.
 */
export function decorate(node, message, actions) {
  const bar = node.querySelector(".actions");
  if (!bar) return;
  for (const old of bar.querySelectorAll(".versions")) old.remove();
  const answer = message.role === "assistant";
  const slot = bar.querySelector(`[data-slot="${answer ? "regenerate" : "edit"}"]`);
  if (slot) {
    slot.replaceChildren(
      answer
        ? button("Regenerate", "Regenerate this answer", true, () => actions.regenerate(message.id))
        : button("Edit", "Edit this message", true, () => startEditing(node, message, actions.edit)),
    );
  }
  const switcher = versions(message, actions.switchTo);
  if (switcher) bar.prepend(switcher);
}
