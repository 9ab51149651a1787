// Message bubbles: what a person sees of each message, including how an answer ended.

import { el } from "./dom.js";
import { MarkdownView } from "./markdown.js";
import { cutOffReason } from "./termination.js";

/** What the person wrote, one block per line: each takes its own direction (`dir="auto"`),
 * so an Arabic line after a Japanese one is laid out right to left. */
export function userBubble(message) {
  const lines = message.content.split("\n").map((line) => el("p", { class: "plain", dir: "auto" }, line));
  return el(
    "article",
    { class: "message user", "data-message-id": message.id, "aria-label": "You said" },
    el("div", { class: "bubble" }, lines),
  );
}

const CONNECTION_WORDS = {
  connecting: "Connecting…",
  live: "",
  reconnecting: "Reconnecting…",
};

/**
 * An assistant answer. It owns the answer's text as received: the stream appends to it,
 * a Continue appends to the same bubble, and the markdown view renders it.
 */
export class AssistantBubble {
  constructor(message, config, actions) {
    this.id = message.id;
    this.config = config;
    this.actions = actions;
    this.text = message.content || "";
    this.status = message.status;
    this.content = el("div", { class: "content", dir: "auto" });
    this.markdown = new MarkdownView(this.content);
    this.state = el("p", { class: "stream-state", role: "status" });
    this.reason = el("span", { class: "cut-off-reason" });
    this.continueButton = el("button", { type: "button", class: "button small continue" }, "Continue");
    this.continueButton.addEventListener("click", () => this.actions.continue(this));
    this.cutOff = el(
      "div",
      { class: "cut-off", hidden: true },
      el("span", { class: "cut-off-mark", "aria-hidden": "true" }, "⚠"),
      this.reason,
      this.continueButton,
    );
    this.node = el(
      "article",
      { class: "message assistant", "data-message-id": this.id, "aria-label": "Answer" },
      el("div", { class: "bubble" }, this.content),
      el("div", { class: "message-foot" }, this.state, this.cutOff),
    );
    this.pending = false;
    this.render();
    if (this.status === "streaming") {
      this.setStreaming();
    } else {
      this.showEnd(message.termination);
    }
  }

  /** Start (or restart, for Continue) a streaming segment in this same bubble. */
  setStreaming() {
    this.stop = null;
    this.status = "streaming";
    this.node.dataset.status = "streaming";
    this.cutOff.hidden = true;
    this.connection("connecting");
  }

  connection(state, detail) {
    this.connectionState = state;
    this.state.title = state === "reconnecting" && detail ? detail : "";
    this.node.dataset.connection = state;
    this.showState();
  }

  /** A Stop was asked for: `pending` while it could not reach the server yet. */
  stopping(pending) {
    this.stop = pending ? "pending" : "sent";
    this.showState();
  }

  showState() {
    const words = CONNECTION_WORDS[this.connectionState] ?? "";
    const stop =
      this.stop === "pending"
        ? "Stop will be sent when the connection is back."
        : this.stop === "sent"
          ? "Stopping…"
          : "";
    this.state.textContent = [words, stop].filter(Boolean).join(" ");
  }

  event(event) {
    if (event.type === "delta") {
      this.text += event.text;
      this.scheduleRender();
    } else if (event.type === "error") {
      this.state.textContent = `Error: ${event.error ? event.error.message : "unknown"}`;
    }
  }

  /** The stream delivered `done`: its record is the termination of this segment. */
  ended(record) {
    this.render();
    this.showEnd(record);
  }

  /** The REST record of a message that ended while we were not connected. */
  settled(message) {
    this.text = message.content;
    this.render();
    this.showEnd(message.termination);
  }

  failed(message) {
    this.status = "failed";
    this.node.dataset.status = "failed";
    this.state.textContent = `Could not follow this answer: ${message}`;
  }

  showEnd(termination) {
    const record = termination || {};
    this.status = record.status || this.status;
    this.node.dataset.status = this.status;
    this.node.dataset.connection = "";
    this.connectionState = null;
    this.stop = null;
    this.state.textContent = "";
    this.markdown.update(this.text, false);
    const reason = cutOffReason(record, this.config);
    this.cutOff.hidden = reason === null;
    if (reason !== null) {
      this.reason.textContent = record.has_unclosed_code_block
        ? `${reason} (a code block was left open)`
        : reason;
      this.continueButton.disabled = false;
    }
  }

  scheduleRender() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => this.render());
  }

  render() {
    this.pending = false;
    this.markdown.update(this.text, this.status === "streaming");
    if (this.actions.rendered) this.actions.rendered(this);
  }
}
