// The model's reasoning, shown apart from its answer: a "Thinking" block above it.
//
// While the model thinks, the block is open and the reasoning streams into it; it folds
// shut when the answer begins and then says how long the thinking took. Reasoning is
// plain text (a text node), never markup.

import { el } from "./dom.js";

function seconds(ms) {
  const s = Math.max(0, ms) / 1000;
  return s < 10 ? `${s.toFixed(1)} s` : `${Math.round(s)} s`;
}

/** How long a finished answer thought, from its termination record, in words. */
function thoughtFor(termination) {
  const record = termination || {};
  if (record.ended_in_reasoning) return "Thinking (cut off)";
  const { reasoning_ttft_ms: from, ttft_ms: to } = record;
  if (typeof from === "number" && typeof to === "number") return `Thought for ${seconds(to - from)}`;
  return "Thought";
}

export class ThinkingBlock {
  /**
   * `timed`: the reasoning arrives as the model makes it, so the time from its first piece
   * to the answer is how long the model thought. Not so for an answer followed from the
   * start of its log (a reload, another tab), whose reasoning so far comes in one burst:
   * measured, it would read "Thought for 0.0 s"; it says "Thought" until the answer's
   * record gives the server's figure.
   */
  constructor(reasoning, termination, { timed = true } = {}) {
    this.text = reasoning || "";
    this.timed = timed;
    this.thinkingSince = null;
    this.label = el("span", { class: "thinking-label" }, thoughtFor(termination));
    this.body = el("div", { class: "thinking-text", dir: "auto" }, this.text);
    this.node = el(
      "details",
      { class: "thinking", hidden: !this.text, "aria-label": "The model's reasoning" },
      el("summary", {}, this.label),
      this.body,
    );
  }

  /** More reasoning arrived: show it live, open. */
  append(text) {
    if (!text) return;
    if (this.thinkingSince === null) {
      this.thinkingSince = performance.now();
      this.node.open = true;
      this.node.dataset.state = "thinking";
      this.label.textContent = "Thinking…";
    }
    this.text += text;
    this.body.textContent = this.text;
    this.node.hidden = false;
  }

  /** The answer began (or the segment ended): fold the reasoning away, say for how long. */
  settle(termination) {
    if (this.thinkingSince === null) {
      if (termination) this.label.textContent = thoughtFor(termination);
      return;
    }
    const took = performance.now() - this.thinkingSince;
    this.thinkingSince = null;
    const cut = termination && termination.ended_in_reasoning;
    this.node.dataset.state = cut ? "cut" : "done";
    if (!this.timed) this.label.textContent = thoughtFor(termination);
    else this.label.textContent = cut ? `Thinking for ${seconds(took)} (cut off)` : `Thought for ${seconds(took)}`;
    if (!cut) this.node.open = false;
  }

  /** The stored reasoning of a message that ended while it was not followed. */
  replace(reasoning, termination) {
    this.text = reasoning || "";
    this.body.textContent = this.text;
    this.node.hidden = !this.text;
    this.thinkingSince = null;
    this.label.textContent = thoughtFor(termination);
  }
}
