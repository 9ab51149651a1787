// What the person was typing, per conversation, kept in localStorage: a reload, a switch to
// another conversation or a session that ended (sign in again, come back) finds it still
// in the message box. A draft goes when its message is sent.

const PREFIX = "chat.draft.";
const NEW = "new";

export class Drafts {
  constructor(input) {
    this.input = input;
    this.key = PREFIX + NEW;
    // The box is in the page before the scripts run, so a person may type before the
    // first conversation opens: the first `open` keeps that text (it replaced it).
    this.started = false;
    input.addEventListener("input", () => this.save());
  }

  /** The message box now belongs to conversation `id` (null: a new one). */
  open(id) {
    const typed = this.started ? "" : this.input.value;
    if (typed && localStorage.getItem(this.key) === typed) localStorage.removeItem(this.key);
    this.started = true;
    this.key = PREFIX + (id || NEW);
    const stored = localStorage.getItem(this.key) || "";
    this.input.value = [stored, typed].filter(Boolean).join(stored.endsWith("\n") ? "" : "\n");
    if (typed) this.save();
    this.input.dispatchEvent(new Event("draft"));
  }

  save() {
    if (this.input.value) localStorage.setItem(this.key, this.input.value);
    else localStorage.removeItem(this.key);
  }

  /** The draft of conversation `id` (null: a new one) was sent. */
  sent(id) {
    localStorage.removeItem(PREFIX + (id || NEW));
  }
}
