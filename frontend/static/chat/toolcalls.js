// The tool calls a model makes, shown as labelled blocks below its answer. The page does
// not run tools: the app that asked for them does (through /v1) and sends the results.
// Names and arguments are model output: text nodes only.

import { el } from "./dom.js";

function shown(args) {
  try {
    return JSON.stringify(JSON.parse(args), null, 2);
  } catch {
    return args; // still streaming, or not JSON: as the model wrote it
  }
}

export class ToolCallsBlock {
  /** @param {Array} calls  stored calls, OpenAI's shape: [{id, function: {name, arguments}}] */
  constructor(calls) {
    this.node = el("div", { class: "tool-calls", hidden: true });
    this.calls = new Map();
    this.replace(calls);
  }

  replace(calls) {
    this.calls.clear();
    this.node.replaceChildren();
    (calls || []).forEach((call, index) =>
      this.add({ index, id: call.id, name: call.function.name, arguments: call.function.arguments }),
    );
  }

  /** One piece of a call (a `tool_call` event): the first names it, all add arguments. */
  add(piece) {
    let call = this.calls.get(piece.index);
    if (!call) {
      call = {
        name: el("span", { class: "tool-call-name" }),
        args: el("pre", { class: "tool-call-arguments", dir: "ltr" }),
        text: "",
      };
      const node = el(
        "section",
        { class: "tool-call", "aria-label": "Tool call" },
        el("p", { class: "tool-call-head" }, "Tool call ", call.name),
        call.args,
      );
      this.calls.set(piece.index, call);
      this.node.append(node);
      this.node.hidden = false;
    }
    if (piece.name) call.name.textContent = piece.name;
    call.text += piece.arguments || "";
    call.args.textContent = shown(call.text);
  }
}
