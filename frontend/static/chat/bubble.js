// Message bubbles: what a person sees of each message, including how an answer ended,
// and each message's action bar (Copy, its time on hover, and the places where
// Regenerate and Edit go).

import { el } from "./dom.js";
import { copyWithFeedback, MarkdownView } from "./markdown.js";
import { canContinue, cutOffReason } from "./termination.js";
import { ThinkingBlock } from "./thinking.js";
import { ToolCallsBlock } from "./toolcalls.js";

const TIME = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit" });
const FULL_TIME = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium" });

function messageTime(iso) {
  if (!iso) return null;
  const date = new Date(iso);
  return el("time", { class: "time", datetime: iso, title: FULL_TIME.format(date) }, TIME.format(date));
}

/**
 * A message's action bar: Copy (the message as its Markdown source), empty places named
 * by `slots` for the actions other parts of the page add (`data-slot="regenerate"`,
 * `"edit"`), and the message's time, shown on hover or focus.
 */
function actionBar(label, copyLabel, text, slots, createdAt) {
  const copy = el("button", { type: "button", class: "button small action copy-message", "aria-label": copyLabel }, "Copy");
  copy.addEventListener("click", () => copyWithFeedback(copy, text()));
  return el(
    "div",
    { class: "actions", role: "toolbar", "aria-label": label },
    copy,
    slots.map((slot) => el("span", { class: "action-slot", "data-slot": slot })),
    messageTime(createdAt),
  );
}

/** What the person wrote, one block per line: each takes its own direction (`dir="auto"`),
 * so an Arabic line after a Japanese one is laid out right to left. */
export function userBubble(message) {
  const lines = message.content.split("\n").map((line) => el("p", { class: "plain", dir: "auto" }, line));
  // A tool's result (from an app running a tool loop through /v1) is input too, not yours.
  const tool = message.role === "tool";
  return el(
    "article",
    {
      class: tool ? "message user tool-result" : "message user",
      "data-message-id": message.id,
      "aria-label": tool ? "Tool result" : "You said",
    },
    el("div", { class: "bubble" }, tool ? el("p", { class: "tool-call-head" }, "Tool result") : null, lines),
    actionBar("Message actions", "Copy the message", () => message.content, tool ? [] : ["edit"], message.created_at),
  );
}

// Past this long without a token, a streaming answer says so, counting.
const QUIET_MS = 3000;

const CONNECTION_WORDS = {
  connecting: "Connecting…",
  live: "",
  reconnecting: "Reconnecting…",
};

/**
 * An assistant answer. It owns the answer's text as received: the stream appends to it,
 * a Continue appends to the same bubble, and the markdown view renders it. `timed`
 * (`ThinkingBlock`): its events arrive as they are made, so how long it thought is
 * measured here; false for an answer found streaming, whose events up to now are replayed.
 */
export class AssistantBubble {
  constructor(message, config, actions, { timed = true } = {}) {
    this.id = message.id;
    this.config = config;
    this.actions = actions;
    this.text = message.content || "";
    this.status = message.status;
    this.thinking = new ThinkingBlock(message.reasoning, message.termination, { timed });
    this.content = el("div", { class: "content", dir: "auto" });
    this.tools = new ToolCallsBlock(message.tool_calls);
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
    this.actionBar = actionBar(
      "Answer actions",
      "Copy the answer as Markdown",
      () => this.text,
      ["regenerate"],
      message.created_at,
    );
    this.bubble = el("div", { class: "bubble" }, this.thinking.node, this.content, this.tools.node);
    this.node = el(
      "article",
      { class: "message assistant", "data-message-id": this.id, "aria-label": "Answer" },
      this.bubble,
      el("div", { class: "message-foot" }, this.state, this.cutOff),
      this.actionBar,
    );
    this.pending = false;
    this.clock = null;
    this.error = "";
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
    // The log is a live region: a screen reader announces the answer once it is whole, not
    // every few characters while it streams (its state line below it is still announced).
    this.bubble.setAttribute("aria-busy", "true");
    this.cutOff.hidden = true;
    // Waiting for this segment's first output, then counting any silence between tokens.
    this.segmentOutput = false;
    this.lastTokenAt = performance.now();
    clearInterval(this.clock);
    this.clock = setInterval(() => this.showState(), 1000);
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

  /** While live: waiting for the first token, or how long no token has come. */
  waiting() {
    if (this.status !== "streaming" || this.connectionState !== "live") return "";
    const quiet = Math.floor((performance.now() - this.lastTokenAt) / 1000);
    if (!this.segmentOutput) return quiet >= 1 ? `Waiting for the first token… ${quiet} s` : "Waiting for the first token…";
    return quiet * 1000 >= QUIET_MS ? `No tokens for ${quiet} s…` : "";
  }

  showState() {
    const words = CONNECTION_WORDS[this.connectionState] ?? "";
    const stop =
      this.stop === "pending"
        ? "Stop will be sent when the connection is back."
        : this.stop === "sent"
          ? "Stopping…"
          : "";
    const text = [words || this.waiting(), stop, this.error].filter(Boolean).join(" ");
    if (this.state.textContent !== text) this.state.textContent = text;
    this.node.dataset.waiting = this.segmentOutput ? "" : "first-token";
  }

  /** The model produced something: its text, its reasoning or a tool call. Waiting for
   *  the first token is over (a model that thinks first is not stuck), and any silence is
   *  counted from now. */
  produced() {
    this.lastTokenAt = performance.now();
    if (!this.segmentOutput) {
      this.segmentOutput = true;
      this.showState();
    } else if (this.state.textContent.startsWith("No tokens")) {
      this.showState();
    }
  }

  event(event) {
    if (event.type === "delta") {
      this.thinking.settle();
      this.text += event.text;
      if (event.text) this.produced();
      this.scheduleRender();
    } else if (event.type === "reasoning") {
      this.thinking.append(event.text);
      if (event.text) this.produced();
    } else if (event.type === "tool_call") {
      this.thinking.settle();
      this.tools.add(event);
      this.produced();
    } else if (event.type === "error") {
      this.error = `Error: ${event.error ? event.error.message : "unknown"}`;
      this.showState();
    }
  }

  /** The stream delivered `done`: its record is the termination of this segment. */
  ended(record) {
    this.thinking.settle(record);
    this.render();
    this.showEnd(record);
  }

  /** The REST record of a message that ended while we were not connected. */
  settled(message) {
    this.thinking.replace(message.reasoning, message.termination);
    this.tools.replace(message.tool_calls);
    this.text = message.content;
    this.render();
    this.showEnd(message.termination);
  }

  failed(message) {
    clearInterval(this.clock);
    this.status = "failed";
    this.node.dataset.status = "failed";
    this.bubble.setAttribute("aria-busy", "false");
    this.state.textContent = `Could not follow this answer: ${message}`;
  }

  showEnd(termination) {
    clearInterval(this.clock);
    this.error = "";
    this.node.dataset.waiting = "";
    const record = termination || {};
    this.status = record.status || this.status;
    this.node.dataset.status = this.status;
    this.bubble.setAttribute("aria-busy", "false");
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
      this.continueButton.hidden = !canContinue(record);
    }
  }

  scheduleRender() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => this.render());
  }

  render() {
    this.pending = false;
    // The view may leave the start of the next block for the next frame.
    if (this.markdown.update(this.text, this.status === "streaming")) this.scheduleRender();
    if (this.actions.rendered) this.actions.rendered(this);
  }
}
