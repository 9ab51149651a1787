// Building DOM nodes, and what their key events mean. Text always goes in as text nodes:
// nothing here parses HTML.

/**
 * el("p", {class: "x", dir: "auto"}, "text", childNode) -> HTMLElement.
 * Attributes are set with setAttribute; `on*` keys become event listeners.
 */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      node.addEventListener(key.slice(2), value);
    } else {
      node.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(node, children);
  return node;
}

export function append(node, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

/** Whether a key event belongs to an input method composing a word (Japanese, Chinese):
 * its Enter picks the word and its Escape drops it, so a field's own keys must let it be.
 * Chromium marks such events `isComposing`; the keydown that ends a composition in some
 * browsers has only its key code, 229. */
export function composing(event) {
  return event.isComposing || event.keyCode === 229;
}
