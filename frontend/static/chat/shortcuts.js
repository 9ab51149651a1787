// Keyboard shortcuts, the ones people know from other chat UIs; the header's "?" lists
// them (a popover). Ctrl means Cmd on a Mac.
//
//   Ctrl+Shift+O  new conversation      Shift+Esc  focus the message box
//   Esc           stop the answer       Ctrl+/     show the shortcuts
//
// Esc stops the answer from the message box or from outside any field; in another field
// (search, the settings, a message being edited) it is that field's, as in the products
// people know: cancelling an edit must not stop the answer streaming meanwhile.

const MAC = /Mac|iPhone|iPad/.test(navigator.platform || navigator.userAgent);
const FIELDS = "input, textarea, select, [contenteditable]:not([contenteditable='false'])";

/** Whether a key pressed in `target` belongs to a field of its own (not the composer). */
function inOtherField(target, composer) {
  return target instanceof Element && target !== composer && target.closest(FIELDS) !== null;
}

/**
 * `actions`: {newConversation(), focusComposer(), stop() -> bool (something stopped)};
 * `composer`: the message box, from which Esc stops the answer.
 */
export function installShortcuts(popover, actions, composer) {
  if (MAC) for (const key of popover.querySelectorAll("kbd.mod")) key.textContent = "⌘";
  document.addEventListener("keydown", (e) => {
    const mod = MAC ? e.metaKey : e.ctrlKey;
    const key = e.key.toLowerCase();
    if (mod && e.shiftKey && key === "o") {
      e.preventDefault();
      actions.newConversation();
    } else if (mod && !e.shiftKey && (key === "/" || e.code === "Slash")) {
      e.preventDefault();
      popover.togglePopover();
    } else if (e.key === "Escape" && e.shiftKey) {
      e.preventDefault();
      actions.focusComposer();
    } else if (
      e.key === "Escape" &&
      !e.isComposing && // an input method's Esc cancels its word, not the answer
      !e.defaultPrevented &&
      !document.querySelector("dialog[open]")
    ) {
      if (document.querySelector(":popover-open")) return; // Esc closes a popover first
      if (inOtherField(e.target, composer)) return;
      if (actions.stop()) e.preventDefault();
    }
  });
}
