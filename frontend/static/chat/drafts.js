// What the person was typing, per conversation, kept in localStorage: a reload, a switch to
// another conversation or a session that ended (sign in again, come back) finds it still
// in the message box. A draft goes when its message is sent.

const PREFIX = "chat.draft.";
const NEW = "new";

export class Drafts {
  constructor(input) {
    this.input = input;
    this.key = PREFIX + NEW;
    input.addEventListener("input", () => this.save());
  }

  /** The message box now belongs to conversation `id` (null: a new one). */
  open(id) {
    this.key = PREFIX + (id || NEW);
    this.input.value = localStorage.getItem(this.key) || "";
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
