// A safe markdown subset, built from DOM nodes. Model text is only ever put into text
// nodes: there is no HTML parsing anywhere on this path, so markup in an answer shows as
// the characters it is made of.
//
// Blocks: paragraphs, headings (shown as bold paragraphs), bullet and numbered lists,
// fenced code (``` or ~~~) with a copy button. Inline: `code`, **bold**, [text](url) and
// bare http(s) URLs; only http(s) links become anchors, anything else stays text.
// A fence that is not closed yet renders as an open code block, so code streams as code.

import { el } from "./dom.js";

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)[^`]*$/;
const BULLET = /^ {0,3}([-*+])\s+(.*)$/;
const NUMBERED = /^ {0,3}(\d{1,9})[.)]\s+(.*)$/;
const HEADING = /^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$/;
const INLINE =
  /`([^`\n]+)`|\*\*([^*\n]+?)\*\*|\[([^\]\n]+)\]\(([^()\s]+)\)|(https?:\/\/[^\s<>()"'`]+)/g;

function listItem(line) {
  let m = BULLET.exec(line);
  if (m) return { kind: "ul", text: m[2] };
  m = NUMBERED.exec(line);
  if (m) return { kind: "ol", text: m[2], number: Number(m[1]) };
  return null;
}

/** Split text into blocks; each keeps its source so unchanged blocks are not rebuilt. */
export function parseBlocks(text) {
  const lines = text.split("\n");
  const blocks = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = FENCE.exec(line);
    if (fence) {
      const marker = fence[1];
      const closing = new RegExp(`^ {0,3}${marker[0] === "`" ? "`" : "~"}{${marker.length},}\\s*$`);
      const body = [];
      let j = i + 1;
      let open = true;
      while (j < lines.length) {
        if (closing.test(lines[j])) {
          open = false;
          break;
        }
        body.push(lines[j]);
        j += 1;
      }
      blocks.push({
        kind: "code",
        lang: fence[2] || "",
        text: body.join("\n"),
        open,
        source: lines.slice(i, j + 1).join("\n") + (open ? "\u0000open" : ""),
      });
      i = j + 1;
      continue;
    }
    if (line.trim() === "") {
      i += 1;
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      blocks.push({ kind: "heading", text: heading[1], source: line });
      i += 1;
      continue;
    }
    const first = listItem(line);
    if (first) {
      const items = [first.text];
      const start = i;
      let j = i + 1;
      while (j < lines.length) {
        const next = lines[j];
        const item = listItem(next);
        if (item && item.kind === first.kind) {
          items.push(item.text);
        } else if (item || next.trim() === "" || FENCE.test(next)) {
          // A blank line ends the list unless the list goes on right after it.
          const after = next.trim() === "" ? listItem(lines[j + 1] || "") : null;
          if (after && after.kind === first.kind) {
            j += 1;
            continue;
          }
          break;
        } else {
          items[items.length - 1] += `\n${next.trim()}`;
        }
        j += 1;
      }
      blocks.push({
        kind: first.kind,
        items,
        start: first.number,
        source: lines.slice(start, j).join("\n"),
      });
      i = j;
      continue;
    }
    const start = i;
    let j = i + 1;
    while (
      j < lines.length &&
      lines[j].trim() !== "" &&
      !FENCE.test(lines[j]) &&
      !listItem(lines[j]) &&
      !HEADING.test(lines[j])
    ) {
      j += 1;
    }
    const source = lines.slice(start, j).join("\n");
    blocks.push({ kind: "p", text: source, source });
    i = j;
  }
  return blocks;
}

function safeHref(url) {
  try {
    const parsed = new URL(url);
    return parsed.protocol === "http:" || parsed.protocol === "https:" ? parsed.href : null;
  } catch {
    return null;
  }
}

function link(href, text) {
  return el("a", { href, rel: "noopener noreferrer nofollow", target: "_blank" }, text);
}

/** Inline markup of one block's text, as nodes. */
export function inlineNodes(text) {
  const nodes = [];
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    let node = null;
    let consumed = m[0];
    if (m[1] !== undefined) {
      node = el("code", {}, m[1]);
    } else if (m[2] !== undefined) {
      node = el("strong", {}, m[2]);
    } else if (m[3] !== undefined) {
      const href = safeHref(m[4]);
      node = href ? link(href, m[3]) : null;
    } else if (m[5] !== undefined) {
      // Sentence punctuation after a bare URL is not part of it.
      const url = m[5].replace(/[.,;:!?]+$/, "");
      consumed = url;
      const href = safeHref(url);
      node = href ? link(href, url) : null;
    }
    if (node === null) continue;
    if (m.index > last) nodes.push(document.createTextNode(text.slice(last, m.index)));
    nodes.push(node);
    last = m.index + consumed.length;
  }
  if (last < text.length) nodes.push(document.createTextNode(text.slice(last)));
  return nodes;
}

async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  const area = el("textarea", { class: "visually-hidden", readonly: true });
  area.value = text;
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
}

function codeBlock(block) {
  const code = el("code", {}, block.text);
  const button = el("button", { type: "button", class: "button small copy" }, "Copy");
  button.addEventListener("click", async () => {
    try {
      await copyText(block.text);
      button.textContent = "Copied";
    } catch {
      button.textContent = "Copy failed";
    }
    setTimeout(() => {
      button.textContent = "Copy";
    }, 1500);
  });
  return el(
    "div",
    { class: "code-block", "data-open": block.open ? "true" : "false" },
    el("div", { class: "code-head" }, el("span", { class: "code-lang" }, block.lang || "code"), button),
    el("pre", { dir: "ltr", tabindex: "0" }, code),
  );
}

function renderBlock(block) {
  switch (block.kind) {
    case "code":
      return codeBlock(block);
    case "heading":
      return el("p", { class: "md-heading", dir: "auto" }, el("strong", {}, ...inlineNodes(block.text)));
    case "ul":
    case "ol":
      return el(
        block.kind,
        { dir: "auto", start: block.kind === "ol" && block.start !== 1 ? block.start : null },
        block.items.map((item) => el("li", { dir: "auto" }, ...inlineNodes(item))),
      );
    default:
      return el("p", { dir: "auto" }, ...inlineNodes(block.text));
  }
}

/**
 * The element the streaming cursor goes into: the innermost element that ends the block,
 * so the cursor sits right after the last character (inside an open code block's last
 * line, after a list's last word), not on a line of its own below it.
 */
function cursorHost(block) {
  let host = block;
  for (;;) {
    let last = host.lastChild;
    while (last && last.nodeType === Node.TEXT_NODE && last.data.trim() === "") last = last.previousSibling;
    if (!last || last.nodeType !== Node.ELEMENT_NODE || last.matches("button, br, .code-head")) return host;
    host = last;
  }
}

/**
 * Renders a growing text into a container. Blocks whose source did not change keep their
 * nodes (and focus, selection, a pressed copy button); only the changed tail is rebuilt.
 * While `streaming`, a cursor (an empty element: it adds nothing to the text) follows the
 * last character.
 */
export class MarkdownView {
  constructor(container) {
    this.container = container;
    this.sources = [];
    this.cursor = el("span", { class: "cursor", "aria-hidden": "true" });
  }

  update(text, streaming = false) {
    this.cursor.remove();
    const blocks = parseBlocks(text);
    let keep = 0;
    while (keep < blocks.length && keep < this.sources.length && blocks[keep].source === this.sources[keep]) {
      keep += 1;
    }
    const children = this.container.children;
    while (children.length > keep) children[children.length - 1].remove();
    for (const block of blocks.slice(keep)) this.container.append(renderBlock(block));
    this.sources = blocks.map((b) => b.source);
    const last = this.container.lastElementChild;
    if (streaming && last) cursorHost(last).append(this.cursor);
  }
}
