// Markdown as people know it (GitHub-flavoured: tables, task lists, strikethrough, nested
// lists, blockquotes, rules), highlighted code, and math, on kept libraries vendored under
// /static/vendor/ (frontend/vendor.json pins them): marked parses, highlight.js colours
// code, KaTeX typesets `$…$` and `$$…$$`, DOMPurify sanitises.
//
// Model output never becomes live HTML. Markup in an answer is escaped by the renderer
// (`<b>` shows as those characters); what marked, highlight.js and KaTeX produce from the
// markdown goes through DOMPurify, which hands back nodes (no innerHTML here). Links are
// http(s) or mailto only, open in a new tab without a referrer, and a link whose visible
// text names another host anywhere in it (or hides characters) shows the host it really
// goes to. Images are never loaded:
// they show as links to the image.
//
// Rendering is incremental: every block before the last is complete once a later block
// has started, so it is rendered once and kept; only the last, unfinished block is parsed
// again as text arrives (the caller asks at most once per animation frame), and its new
// nodes are patched into the ones shown, so only what changed is laid out and painted
// again. Blocks go into groups of `KEPT_GROUP`; a full group (`.kept`) is laid out and
// painted only while near the viewport (`content-visibility`), so a frame costs about the
// same at the end of a long answer as at its start. The last block is shown at the end of
// the open group, so when it completes its nodes stay where they are. A code block still
// open while streaming is its text only, updated in place; it is highlighted once, when
// its fence closes (re-highlighting the whole block on every frame was the largest cost of
// a long code block). Link reference definitions apply to the whole answer: a block shown
// before the definition it names is rendered again.

import DOMPurify from "../vendor/dompurify/dist/purify.es.mjs";
import hljs from "../vendor/@highlightjs/cdn-assets/es/highlight.min.js";
import { Lexer, Marked } from "../vendor/marked/lib/marked.esm.js";
import markedKatex from "../vendor/marked-katex-extension/lib/index.esm.js";
import { el } from "./dom.js";

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

function safeUrl(href) {
  try {
    const url = new URL(href);
    return ["http:", "https:", "mailto:"].includes(url.protocol) ? url : null;
  } catch {
    return null;
  }
}

/** The text a reader sees of inline tokens (a link's text): every text, code span and
 * emphasis inside it, and markup written as HTML too, which the renderer shows as the
 * characters it is made of (a tag or a comment naming a host is read as naming it). */
function seenText(tokens) {
  let text = "";
  for (const token of tokens || []) {
    if (token.tokens) text += seenText(token.tokens);
    else if (typeof token.text === "string") text += token.text;
  }
  return text;
}

// Characters that hide or reorder text without being seen (zero-width, direction
// controls: U+202E shows "moc.elpmaxe" as "example.com"), and dots that are not "." but
// look it (or are read as it in a host: IDNA's ideographic and fullwidth stops).
const HIDDEN = /[\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]/u;
const LOOKALIKE_DOTS = /[\u2024\u3002\uff0e\uff61\u00b7\u2027\u30fb]/gu;
const HOST_LIKE = /(?:^|[^\p{L}\p{N}@.-])((?:[\p{L}\p{N}](?:[\p{L}\p{N}-]*[\p{L}\p{N}])?\.)+\p{L}{2,})(?![\p{L}\p{N}-])/gu;

/** Whether a link's visible text could make a reader think it goes elsewhere than
 * ``url``: it names another host anywhere in it (as a URL, a domain, in a sentence, in
 * bold or code, with look-alike dots), or hides or reorders characters. */
function misleads(text, url) {
  if (HIDDEN.test(text)) return true;
  const shown = text.normalize("NFKC").replace(LOOKALIKE_DOTS, ".");
  for (const match of shown.matchAll(HOST_LIKE)) {
    let claimed;
    try {
      claimed = new URL(`https://${match[1]}`).hostname;
    } catch {
      continue;
    }
    if (!sameHost(claimed, url.hostname)) return true;
  }
  return false;
}

function sameHost(a, b) {
  const bare = (host) => host.toLowerCase().replace(/^www\./, "");
  return bare(a) === bare(b);
}

/** A fenced block whose closing fence has not arrived (yet, or ever). */
function openFence(raw) {
  const opening = /^ {0,3}(`{3,}|~{3,})/.exec(raw);
  if (!opening) return false;
  const lines = raw.replace(/\n+$/, "").split("\n");
  if (lines.length < 2) return true;
  const marker = opening[1];
  const closing = new RegExp(`^ {0,3}\\${marker[0]}{${marker.length},}\\s*$`);
  return !closing.test(lines[lines.length - 1]);
}

function codeBlock({ text, lang, raw }) {
  const language = (lang || "").trim().split(/\s+/)[0];
  const known = language && hljs.getLanguage(language) ? language : "";
  const body = known
    ? hljs.highlight(text, { language: known, ignoreIllegals: true }).value
    : escapeHtml(text);
  const label = escapeHtml(language || "code");
  return (
    `<div class="code-block" data-open="${openFence(raw)}">` +
    `<div class="code-head"><span class="code-lang">${label}</span>` +
    `<button type="button" class="button small copy">Copy</button></div>` +
    `<pre dir="ltr" tabindex="0"><code class="hljs${known ? ` language-${label}` : ""}">${body}</code></pre>` +
    "</div>"
  );
}

// Links being rendered around the current token: an image inside one (a badge that links
// elsewhere) is its label, not a link of its own (a link in a link is split apart by the
// HTML parser, leaving the outer one empty).
let linkDepth = 0;

const renderer = {
  // Markup written by the model is text: shown as the characters it is made of. A block of
  // it (a page written out without a fence) keeps its lines and their indentation, as
  // written: as a paragraph's text, its line breaks would read as spaces.
  html({ text, block }) {
    return block ? `<p class="plain">${escapeHtml(text.replace(/\n+$/, ""))}</p>` : escapeHtml(text);
  },
  link(token) {
    const url = safeUrl(token.href);
    if (!url) return escapeHtml(token.raw);
    linkDepth += 1;
    let inner;
    try {
      inner = this.parser.parseInline(token.tokens);
    } finally {
      linkDepth -= 1;
    }
    const note = misleads(seenText(token.tokens), url)
      ? `<span class="link-host"> (${escapeHtml(url.hostname || url.href)})</span>`
      : "";
    return `<a href="${escapeHtml(url.href)}" title="${escapeHtml(url.href)}">${inner}</a>${note}`;
  },
  image(token) {
    const url = safeUrl(token.href);
    if (!url) return escapeHtml(token.raw);
    const label = escapeHtml(`Image: ${token.text || url.hostname}`);
    if (linkDepth > 0) return `<span class="image-link">${label}</span>`;
    return `<a class="image-link" href="${escapeHtml(url.href)}" title="${escapeHtml(url.href)}">${label}</a>`;
  },
  code: codeBlock,
};

const OPTIONS = { gfm: true, breaks: true };
const marked = new Marked(OPTIONS);
// Sizes the TeX gives (\rule, \kern, \raisebox) are capped, and macros expanded a bounded
// number of times: math must not draw a page of its own, or outside its answer (the CSS
// clips what still would, such as a negative kern, which no cap reaches).
marked.use(
  markedKatex({ throwOnError: false, output: "htmlAndMathml", maxSize: 10, maxExpand: 100 }),
);
marked.use({ renderer });

const SANITIZE = {
  RETURN_DOM_FRAGMENT: true,
  USE_PROFILES: { html: true, svg: true, mathMl: true },
  FORBID_TAGS: [
    "style", "img", "form", "textarea", "select", "option", "video", "audio", "source",
    "picture", "iframe", "object", "embed", "link", "meta", "base", "dialog",
  ],
  // MathML's own structure: KaTeX puts the TeX source in an annotation, for screen readers.
  ADD_TAGS: ["semantics", "annotation"],
  ADD_ATTR: ["encoding"],
  // DOMPurify's default, with only http(s) and mailto as schemes: the regexp also decides
  // every attribute value that is not a URL, which must still pass.
  ALLOWED_URI_REGEXP: /^(?:(?:https?|mailto):|[^a-z]|[a-z+.-]+(?:[^a-z+.\-:]|$))/i,
};
// Set once: a configuration passed to each sanitize call is parsed again on every call,
// which is most of what sanitising a small block costs.
DOMPurify.setConfig(SANITIZE);
// Task lists' checkboxes are the only inputs: disabled, never anything else.
DOMPurify.addHook("uponSanitizeElement", (node, data) => {
  if (data.tagName === "input" && !(node.getAttribute("type") === "checkbox" && node.hasAttribute("disabled"))) {
    node.remove();
  }
});

// Blocks per group: few enough that a group is about a screen, many enough that the
// answer has a few dozen children, not hundreds, to lay out and to watch for visibility.
const KEPT_GROUP = 8;

const TEXT_BLOCKS = "p, li, h1, h2, h3, h4, h5, h6, blockquote, td, th, dt, dd";

/** One block's tokens as sanitised nodes, with the page's link and direction rules. */
function renderTokens(tokens) {
  const fragment = DOMPurify.sanitize(marked.parser(tokens));
  for (const a of fragment.querySelectorAll("a")) {
    a.setAttribute("rel", "noopener noreferrer nofollow");
    a.setAttribute("target", "_blank");
  }
  for (const table of fragment.querySelectorAll("table")) {
    const wrap = el("div", { class: "table-wrap", tabindex: "0" });
    table.replaceWith(wrap);
    wrap.append(table);
  }
  // Each block takes the direction of its own text: Arabic or Hebrew right to left.
  for (const node of fragment.children) if (!node.hasAttribute("dir")) node.setAttribute("dir", "auto");
  for (const node of fragment.querySelectorAll(TEXT_BLOCKS)) node.setAttribute("dir", "auto");
  return [...fragment.childNodes];
}

/**
 * The element the streaming cursor goes into: the innermost element that ends the block,
 * so the cursor sits right after the last character (inside an open code block's last
 * line, after a list's last word), not on a line of its own below it.
 */
function cursorHost(block, cursor) {
  let host = block;
  for (;;) {
    let last = host.lastChild;
    while (last && (last === cursor || (last.nodeType === Node.TEXT_NODE && last.data.trim() === ""))) {
      last = last.previousSibling;
    }
    if (!last || last.nodeType !== Node.ELEMENT_NODE || last.matches("button, br, input, .code-head, .katex")) {
      return host;
    }
    host = last;
  }
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

// The buttons saying "Copied" (or "Copy failed") now: their own label, and the timer that
// puts it back. A second press while one says so restarts the timer and keeps the label
// from before the first: read from the button then, it would be "Copied", for good.
const feedback = new WeakMap();

/** Copy `text`, saying so on `button` for a moment. */
export async function copyWithFeedback(button, text) {
  const shown = feedback.get(button);
  const label = shown ? shown.label : button.textContent;
  let said;
  try {
    await copyText(text);
    said = "Copied";
  } catch {
    said = "Copy failed";
  }
  const pending = feedback.get(button);
  if (pending) clearTimeout(pending.timer);
  button.textContent = said;
  const timer = setTimeout(() => {
    feedback.delete(button);
    button.textContent = label;
  }, 1500);
  feedback.set(button, { label, timer });
}

/**
 * Renders a growing markdown text into a container. Blocks before the last are rendered
 * once and kept (their nodes, focus, selection, a pressed Copy button stay); the last block
 * is parsed on each update and patched into its nodes. While `streaming`, a cursor (an
 * empty element: it adds nothing to the text) follows the last character.
 */
export class MarkdownView {
  constructor(container) {
    this.container = container;
    this.cursor = el("span", { class: "cursor", "aria-hidden": "true" });
    this.reset();
    container.addEventListener("click", (e) => {
      const button = e.target.closest(".copy");
      if (!button || !container.contains(button)) return;
      const code = button.closest(".code-block").querySelector("pre code");
      copyWithFeedback(button, code.textContent);
    });
  }

  reset() {
    this.container.replaceChildren();
    this.kept = ""; // the source of the kept blocks: a prefix of every later text
    this.links = new Map(); // link reference definitions that will not change, in order
    this.linked = []; // kept blocks that may refer to one: {raw, nodes, defined}
    this.tail = []; // the nodes of the last block, at the end of the open group
    this.open = null; // the last block while it is a code block still open: {node, text}
    this.group = null; // the open group: the last kept blocks, then the last block
    this.blocks = 0; // kept blocks in the open group
  }

  /**
   * Shows `text`. Returns true when it left part of it for the next frame: a block
   * completed, and the next block's first characters wait one frame (the caller asks for
   * that frame), so that a frame where a block completes does no more than any other.
   */
  update(text, streaming = false) {
    const source = text.replace(/\r\n?/g, "\n");
    if (!source.startsWith(this.kept)) this.reset();
    const tokens = this.lex(source.slice(this.kept.length));
    let last = tokens.length - 1;
    while (last > 0 && tokens[last].type === "space") last -= 1;
    const kept = tokens.slice(0, Math.max(last, 0));
    const rest = last >= 0 ? tokens.slice(last) : [];
    // The definitions of complete blocks (of them all at the end: a streaming last block
    // may hold half a URL) apply to the whole answer, blocks shown before them included.
    this.define(streaming ? kept : tokens);
    // A completed block is what the last block's nodes showed, with its last characters:
    // they are patched where they are, so they are not built or laid out again.
    for (const token of kept) {
      this.place(renderTokens([token]));
      // A blank line or a link definition shows nothing.
      if (this.tail.length > 0) {
        this.blocks += 1;
        if (token.raw.includes("[")) {
          this.linked.push({ raw: token.raw, nodes: this.tail, defined: this.links.size });
        }
      }
      this.tail = [];
      this.kept += token.raw;
    }
    const deferred = streaming && kept.length > 0 && rest.length > 0;
    if (deferred) {
      this.tail = [];
    } else if (streaming && rest.length === 1 && rest[0].type === "code" && openFence(rest[0].raw)) {
      const lang = rest[0].lang || "";
      if (!(this.open && this.tail[0] === this.open.node && this.open.lang === lang)) {
        this.open = openCodeBlock(lang);
        this.place([this.open.node], false);
      }
      this.open.text.data = rest[0].text;
    } else {
      this.place(renderTokens(rest));
    }
    if (this.tail[0] !== this.open?.node) this.open = null;
    // The cursor stays where it is when its place did not change: moving it restarts its
    // blink, which costs a style and paint pass of its own.
    const end = this.container.lastElementChild;
    const host = streaming && end ? cursorHost(end, this.cursor) : null;
    if (!host) this.cursor.remove();
    else if (host.lastChild !== this.cursor) host.append(this.cursor);
    return deferred;
  }

  /** Tokens of `source`, its links resolved with the definitions known so far as well as
   * its own (the first definition of a label wins, as in CommonMark). */
  lex(source) {
    const lexer = new Lexer(marked.defaults);
    for (const [tag, link] of this.links) lexer.tokens.links[tag] = link;
    return lexer.lex(source);
  }

  /**
   * Takes the link reference definitions in `tokens` (blocks that will not change). A
   * kept block shown before one of them, whose source names its label, is rendered again
   * with it, through the same sanitising as any block: a reference to a definition further
   * on is a link too. That is rare, so an update costs no more than before otherwise.
   */
  define(tokens) {
    const known = this.links.size;
    marked.walkTokens(tokens, (token) => {
      if (token.type === "def" && !this.links.has(token.tag)) {
        this.links.set(token.tag, { href: token.href, title: token.title });
      }
    });
    if (this.links.size === known) return;
    const tags = [...this.links.keys()];
    for (const block of this.linked) {
      const raw = block.raw.toLowerCase().replace(/\s+/g, " ");
      const named = tags.slice(block.defined).some((tag) => raw.includes(`[${tag}]`));
      block.defined = tags.length;
      if (!named) continue;
      const nodes = renderTokens(this.lex(block.raw));
      block.nodes[0].before(...nodes);
      for (const node of block.nodes) node.remove();
      block.nodes = nodes;
    }
  }

  /**
   * Puts `nodes` (sanitised, not on the page) where the last block is shown, patching
   * the nodes shown there (`patch`) or replacing them, and makes them the last block's.
   * A block starting when the open group is full starts the next group: the full one is
   * kept (`.kept`), laid out and painted only near the viewport from then on.
   */
  place(nodes, patch = true) {
    if (!patch) {
      for (const node of this.tail) node.remove();
      this.tail = [];
    }
    if (this.tail.length === 0) {
      if (nodes.length === 0) return;
      if (!this.group || this.blocks >= KEPT_GROUP) {
        this.group?.classList.add("kept");
        this.group = el("div", { class: "blocks" });
        this.container.append(this.group);
        this.blocks = 0;
      }
    }
    this.tail = patchNodes(this.group, this.tail, nodes, this.cursor);
  }
}

function sameAttributes(a, b) {
  if (a.attributes.length !== b.attributes.length) return false;
  for (const { name, value } of b.attributes) if (a.getAttribute(name) !== value) return false;
  return true;
}

/**
 * Makes `nodes` (children of `parent` on the page, in order, at its end) show what
 * `fresh` (sanitised nodes not on the page) shows, and returns the nodes now there. A text
 * node takes the new text; an element of the same name is kept, takes the new element's
 * attributes (HTML elements only: others must have the same ones) and has its children
 * patched the same way; anything else is replaced by the fresh node. So what did not
 * change is neither built nor laid out again, and keeps its state (a selection in it).
 * `skip` (the cursor) is left out of the comparison, and stays last.
 */
function patchNodes(parent, nodes, fresh, skip) {
  const shown = [];
  const count = Math.max(nodes.length, fresh.length);
  for (let i = 0; i < count; i += 1) {
    const old = nodes[i];
    const now = fresh[i];
    if (!now) {
      old.remove();
    } else if (!old) {
      parent.insertBefore(now, skip.parentNode === parent ? skip : null);
      shown.push(now);
    } else if (old.nodeType === Node.TEXT_NODE && now.nodeType === Node.TEXT_NODE) {
      if (old.data !== now.data) old.data = now.data;
      shown.push(old);
    } else if (
      old.nodeType === Node.ELEMENT_NODE &&
      old.nodeName === now.nodeName &&
      (old.namespaceURI === XHTML ? now.namespaceURI === XHTML : sameAttributes(old, now))
    ) {
      if (!sameAttributes(old, now)) {
        for (const name of old.getAttributeNames()) if (!now.hasAttribute(name)) old.removeAttribute(name);
        for (const { name, value } of now.attributes) old.setAttribute(name, value);
      }
      const children = [...old.childNodes].filter((node) => node !== skip);
      patchNodes(old, children, [...now.childNodes], skip);
      shown.push(old);
    } else {
      old.replaceWith(now);
      shown.push(now);
    }
  }
  return shown;
}

const XHTML = "http://www.w3.org/1999/xhtml";

/**
 * A code block whose fence is still open, built as nodes with its text as a text node (so
 * it is never markup), in the shape `codeBlock` renders; `text` is updated in place.
 */
function openCodeBlock(lang) {
  const language = lang.trim().split(/\s+/)[0];
  const text = document.createTextNode("");
  const node = el(
    "div",
    { class: "code-block", "data-open": "true", dir: "auto" },
    el(
      "div",
      { class: "code-head" },
      el("span", { class: "code-lang" }, language || "code"),
      el("button", { type: "button", class: "button small copy" }, "Copy"),
    ),
    el("pre", { dir: "ltr", tabindex: "0" }, el("code", { class: "hljs" }, text)),
  );
  return { node, text, lang };
}
