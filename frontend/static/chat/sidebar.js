// The conversation list: newest first; open, rename in place, delete.

import { el } from "./dom.js";

export class Sidebar {
  constructor(list, handlers) {
    this.list = list;
    this.handlers = handlers; // {open(id), rename(id, title), remove(id)}
    this.conversations = [];
    this.current = null;
  }

  show(conversations, current) {
    this.conversations = conversations;
    this.current = current;
    this.list.replaceChildren(...conversations.map((c) => this.item(c)));
  }

  select(current) {
    this.current = current;
    for (const item of this.list.children) {
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
