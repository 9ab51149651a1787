// The banner above the composer: one message at a time, dismissible. A banner saying the
// server could not be reached (`unreachable`) clears itself when the server answers again.

export class Notice {
  constructor(node) {
    this.node = node;
    this.text = node.querySelector(".notice-text");
    this.unreachable = false;
    node.querySelector(".notice-close").addEventListener("click", () => this.clear());
  }

  show(text, { unreachable = false } = {}) {
    this.text.textContent = text;
    this.unreachable = unreachable;
    this.node.hidden = !text;
  }

  /** Clear the banner; with `unreachable`, only if it says the server could not be reached. */
  clear({ unreachable = false } = {}) {
    if (unreachable && !this.unreachable) return;
    this.show("");
  }
}
