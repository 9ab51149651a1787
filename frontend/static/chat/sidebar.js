// The conversation list: newest activity first, grouped Today / Yesterday / Earlier, a page
// at a time; a marker on conversations whose answer is streaming; rename and delete from
// each entry's menu (delete after a confirmation in the page). It holds the conversations
// it was given and changes one at a time: a send or a rename updates that entry, never
// refetches the list.

import { confirmAction } from "./confirm.js";
import { composing, el } from "./dom.js";

const DAY_MS = 24 * 60 * 60 * 1000;

/** "Today", "Yesterday" or "Earlier", in the browser's time zone. */
export function groupOf(isoDate, now = new Date()) {
  const startOfToday = new Date(now.getFullYear(), now.getMonth(), now.getDate()).getTime();
  const time = new Date(isoDate).getTime();
  if (time >= startOfToday) return "Today";
  if (time >= startOfToday - DAY_MS) return "Yesterday";
  return "Earlier";
}

export class Sidebar {
  constructor(list, handlers) {
    this.list = list;
    this.handlers = handlers; // {rename(id, title), remove(id), more()}
    this.conversations = [];
    this.current = null;
    this.hasMore = false;
    this.streaming = new Set(); // ids with an answer this tab is following
    this.entries = new Map(); // id -> the entry shown for it (reused while it shows the same)
    this.openMenu = null;
    // The end of the list: when it scrolls into view, the next page is asked for.
    this.more = el("li", { class: "more", "aria-hidden": "true" });
    this.watcher = new IntersectionObserver((entries) => {
      if (this.hasMore && entries.some((e) => e.isIntersecting)) this.handlers.more();
    });
    this.watcher.observe(this.more);
    document.addEventListener("click", (e) => {
      if (this.openMenu && !this.openMenu.contains(e.target)) this.closeMenu();
    });
  }

  /** The first page (again): replaces what is shown. */
  reset(conversations, hasMore) {
    this.conversations = [...conversations];
    this.hasMore = hasMore;
    this.render();
  }

  /** A further page, after what is shown. */
  append(conversations, hasMore) {
    const known = new Set(this.conversations.map((c) => c.id));
    this.conversations.push(...conversations.filter((c) => !known.has(c.id)));
    this.hasMore = hasMore;
    this.render();
  }

  /** A conversation that changed (new message, new title): it moves to the top. */
  upsert(conversation) {
    this.conversations = [conversation, ...this.conversations.filter((c) => c.id !== conversation.id)];
    this.render();
  }

  forget(id) {
    this.conversations = this.conversations.filter((c) => c.id !== id);
    this.render();
  }

  find(id) {
    return this.conversations.find((c) => c.id === id);
  }

  /** The conversations whose answers this tab follows: marked as streaming. */
  setStreaming(ids) {
    this.streaming = new Set(ids);
    for (const conversation of this.conversations) {
      if (!this.streaming.has(conversation.id)) conversation.streaming = false;
    }
    this.render();
  }

  render() {
    // A menu open while the list refreshes (a feed event, an answer's end) stays open on
    // the new entry, keeping focus where it was: it must not vanish under the pointer.
    const menu = this.openMenu;
    const reopen = menu?.parentElement?.dataset.id ?? null;
    const focused = menu ? [...menu.children].indexOf(document.activeElement) : -1;
    this.closeMenu();
    const now = new Date();
    const wanted = [];
    const entries = new Map();
    let group = null;
    for (const conversation of this.conversations) {
      const name = groupOf(conversation.updated_at, now);
      if (name !== group) {
        group = name;
        wanted.push(this.header(name));
      }
      const entry = this.entry(conversation);
      entries.set(conversation.id, entry);
      wanted.push(entry);
    }
    if (!this.conversations.length) wanted.push(el("li", { class: "group empty-list" }, "No conversations"));
    wanted.push(this.more);
    this.entries = entries;
    place(this.list, wanted);
    const item = reopen && entries.get(reopen);
    if (item) this.showMenu(item, item.querySelector(".menu-button"), this.find(reopen), focused);
  }

  /** The entry shown for `conversation` when nothing it shows changed, else a new one: a
   * refresh (any conversation's feed event) then keeps the focus, the pointer's place
   * and every reference to the entries it did not change. */
  entry(conversation) {
    const key = JSON.stringify([conversation.title, conversation.streaming || this.streaming.has(conversation.id)]);
    const shown = this.entries.get(conversation.id);
    if (shown && shown.dataset.key === key && shown.parentNode === this.list) return shown;
    const item = this.item(conversation);
    item.dataset.key = key;
    return item;
  }

  header(name) {
    const shown = [...this.list.children].find((li) => li.classList.contains("group") && li.textContent === name);
    return shown ?? el("li", { class: "group", role: "presentation" }, name);
  }

  select(current) {
    this.current = current;
    for (const item of this.list.querySelectorAll(".conversation")) {
      const selected = item.dataset.id === current;
      item.classList.toggle("current", selected);
      const open = item.querySelector(".open");
      if (selected) open.setAttribute("aria-current", "page");
      else open.removeAttribute("aria-current");
    }
  }

  item(conversation) {
    const title = conversation.title || "Untitled";
    const selected = conversation.id === this.current;
    const streaming = conversation.streaming || this.streaming.has(conversation.id);
    const open = el(
      "a",
      { class: "open", href: `#/c/${conversation.id}`, dir: "auto", "aria-current": selected ? "page" : null },
      title,
      streaming ? el("span", { class: "live", title: "An answer is streaming" }, el("span", { class: "visually-hidden" }, " (streaming)")) : null,
    );
    const menuButton = el(
      "button",
      {
        type: "button",
        class: "button icon small menu-button",
        "aria-label": `Actions for ${title}`,
        "aria-haspopup": "menu",
        "aria-expanded": "false",
      },
      "⋯",
    );
    const item = el(
      "li",
      { class: selected ? "conversation current" : "conversation", "data-id": conversation.id },
      open,
      menuButton,
    );
    menuButton.addEventListener("click", (e) => {
      e.stopPropagation();
      if (this.openMenu && this.openMenu.parentElement === item) this.closeMenu();
      else this.showMenu(item, menuButton, conversation);
    });
    return item;
  }

  /** Open an entry's menu; `focus`: the index of the entry to focus (-1: leave focus). */
  showMenu(item, button, conversation, focus = 0) {
    this.closeMenu();
    const title = conversation.title || "Untitled";
    const rename = el("button", { type: "button", role: "menuitem", class: "menu-item" }, "Rename");
    const remove = el("button", { type: "button", role: "menuitem", class: "menu-item danger-text" }, "Delete");
    const menu = el("div", { class: "menu", role: "menu", "aria-label": `Actions for ${title}` }, rename, remove);
    rename.addEventListener("click", () => {
      this.closeMenu();
      this.editTitle(item, conversation);
    });
    remove.addEventListener("click", async () => {
      this.closeMenu();
      if (await confirmAction(`Delete “${title}” and all its messages?`, "Delete")) {
        this.handlers.remove(conversation.id);
      } else {
        button.focus();
      }
    });
    menu.addEventListener("keydown", (e) => {
      const entries = [rename, remove];
      const at = entries.indexOf(document.activeElement);
      if (e.key === "Escape") {
        e.stopPropagation();
        this.closeMenu();
        button.focus();
      } else if (e.key === "ArrowDown" || e.key === "ArrowUp") {
        e.preventDefault();
        entries[(at + (e.key === "ArrowDown" ? 1 : entries.length - 1)) % entries.length].focus();
      }
    });
    item.append(menu);
    button.setAttribute("aria-expanded", "true");
    this.openMenu = menu;
    if (focus >= 0) [rename, remove][focus]?.focus();
  }

  closeMenu() {
    if (!this.openMenu) return;
    const button = this.openMenu.parentElement && this.openMenu.parentElement.querySelector(".menu-button");
    if (button) button.setAttribute("aria-expanded", "false");
    this.openMenu.remove();
    this.openMenu = null;
  }

  editTitle(item, conversation) {
    const input = el("input", {
      type: "text",
      class: "rename-input",
      maxlength: "200",
      dir: "auto",
      "aria-label": "Conversation title",
    });
    input.value = conversation.title || "";
    let done = false;
    const finish = (save) => {
      if (done) return;
      done = true;
      const title = input.value.trim();
      if (save && title && title !== conversation.title) {
        this.handlers.rename(conversation.id, title);
      } else {
        item.replaceWith(this.item(conversation));
      }
    };
    input.addEventListener("keydown", (e) => {
      if (composing(e)) return; // its Enter picks the word: not Save
      if (e.key === "Enter") {
        e.preventDefault();
        finish(true);
      } else if (e.key === "Escape") {
        e.stopPropagation();
        finish(false);
      }
    });
    input.addEventListener("blur", () => finish(true));
    item.replaceChildren(input);
    input.focus();
    input.select();
  }
}

/** Make `list`'s children `nodes`, in order, moving only the nodes out of place: a node
 * left where it was keeps its focus (moving one takes it away). */
function place(list, nodes) {
  const wanted = new Set(nodes);
  let at = list.firstChild;
  for (const node of nodes) {
    while (at && !wanted.has(at)) {
      const next = at.nextSibling;
      at.remove();
      at = next;
    }
    if (node === at) at = at.nextSibling;
    else list.insertBefore(node, at);
  }
  while (at) {
    const next = at.nextSibling;
    at.remove();
    at = next;
  }
}
