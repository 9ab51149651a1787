// The conversation list: newest activity first, a page at a time; open, rename in place,
// delete. It holds the conversations it was given and changes one of them at a time: a
// send or a rename updates that entry, never refetches the list.

import { el } from "./dom.js";

export class Sidebar {
  constructor(list, handlers) {
    this.list = list;
    this.handlers = handlers; // {rename(id, title), remove(id), more()}
    this.conversations = [];
    this.current = null;
    this.hasMore = false;
    // The end of the list: when it scrolls into view, the next page is asked for.
    this.more = el("li", { class: "more", "aria-hidden": "true" });
    this.watcher = new IntersectionObserver((entries) => {
      if (this.hasMore && entries.some((e) => e.isIntersecting)) this.handlers.more();
    });
    this.watcher.observe(this.more);
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

  render() {
    this.list.replaceChildren(...this.conversations.map((c) => this.item(c)), this.more);
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
    const open = el(
      "a",
      { class: "open", href: `#/c/${conversation.id}`, dir: "auto", "aria-current": selected ? "page" : null },
      title,
    );
    const rename = el("button", { type: "button", class: "button icon small rename", "aria-label": `Rename ${title}` }, "✎");
    const remove = el("button", { type: "button", class: "button icon small delete", "aria-label": `Delete ${title}` }, "✕");
    const item = el("li", { class: selected ? "conversation current" : "conversation", "data-id": conversation.id }, open, rename, remove);
    rename.addEventListener("click", () => this.editTitle(item, conversation));
    remove.addEventListener("click", () => {
      if (window.confirm(`Delete "${title}" and all its messages?`)) this.handlers.remove(conversation.id);
    });
    return item;
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
      if (e.key === "Enter") {
        e.preventDefault();
        finish(true);
      } else if (e.key === "Escape") {
        finish(false);
      }
    });
    input.addEventListener("blur", () => finish(true));
    item.replaceChildren(input);
    input.focus();
    input.select();
  }
}
