// What a new conversation shows before its first message: what this is (the model's name,
// and plainly when the engine is the simulator) and a few prompts to start from.

import { el } from "./dom.js";

const EXAMPLES = [
  "Explain backpressure in streaming APIs, with an example",
  "Write a Python function that merges two sorted lists",
  "Compare SSE and WebSocket in a table",
  "What is the sum of the first n integers? Show the formula",
];

/** `start(prompt)` is called with the example the person picked. */
export function emptyState(config, start) {
  const model = config.model || "the model";
  const examples = EXAMPLES.map((prompt) => {
    const button = el("button", { type: "button", class: "example" }, prompt);
    button.addEventListener("click", () => start(prompt));
    return el("li", {}, button);
  });
  return el(
    "section",
    { class: "empty-state", "aria-label": "New conversation" },
    el("h2", {}, "Chat with ", el("span", { class: "model-name" }, model)),
    config.simulation
      ? el(
          "p",
          { class: "engine-note" },
          "Simulated engine: answers are generated text, not a model. It does not read your question.",
        )
      : null,
    el("p", { class: "empty-hint" }, "Ask anything, or start from one of these:"),
    el("ul", { class: "examples" }, examples),
  );
}
