// Keyboard shortcuts, the ones people know from other chat UIs; the header's "?" lists
// them (a popover). Ctrl means Cmd on a Mac.
//
//   Ctrl+Shift+O  new conversation      Shift+Esc  focus the message box
//   Esc           stop the answer       Ctrl+/     show the shortcuts

const MAC = /Mac|iPhone|iPad/.test(navigator.platform || navigator.userAgent);

/** `actions`: {newConversation(), focusComposer(), stop() -> bool (something stopped)}. */
export function installShortcuts(popover, actions) {
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
    } else if (e.key === "Escape" && !e.defaultPrevented && !document.querySelector("dialog[open]")) {
      if (popover.matches(":popover-open")) return; // Esc closes the popover first
      if (actions.stop()) e.preventDefault();
    }
  });
}
