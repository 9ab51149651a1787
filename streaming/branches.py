"""A conversation's messages as a tree: the path to a message, its siblings, a branch's leaf.

Built from one query of (id, parent) pairs in creation order, so every question about a
conversation's shape is answered without a query per message. Ids are strings here, as
they are in the API.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from streaming import statements
from streaming.models import Message


class Tree:
    def __init__(self, rows: Iterable[tuple[Any, Any]]) -> None:
        """``rows``: (id, parent id) of every message, oldest first."""
        self.parents: dict[str, str | None] = {}
        self.children: defaultdict[str | None, list[str]] = defaultdict(list)
        for message_id, parent_id in rows:
            key, parent = str(message_id), None if parent_id is None else str(parent_id)
            self.parents[key] = parent
            self.children[parent].append(key)

    def __contains__(self, message_id: object) -> bool:
        return str(message_id) in self.parents

    def path(self, message_id: Any) -> list[str]:
        """The ids from the conversation's first message down to ``message_id``."""
        path: list[str] = []
        current: str | None = str(message_id)
        while current is not None:
            path.append(current)
            current = self.parents[current]
        path.reverse()
        return path

    def children_of(self, parent_id: Any) -> list[str]:
        """The children of ``parent_id`` (roots for ``None``), in creation order."""
        return list(self.children.get(None if parent_id is None else str(parent_id), ()))

    def siblings(self, message_id: Any) -> list[str]:
        """The messages sharing ``message_id``'s parent, in creation order, itself included."""
        return self.children_of(self.parents[str(message_id)])

    def leaf_below(self, message_id: Any) -> str:
        """The end of the branch through ``message_id``: down its latest children."""
        current = str(message_id)
        while self.children.get(current):
            current = self.children[current][-1]
        return current

    def last_leaf(self) -> str | None:
        """The branch a conversation without a recorded leaf shows: the latest root's."""
        roots = self.children.get(None)
        return self.leaf_below(roots[-1]) if roots else None

    def subtree(self, message_id: Any) -> list[str]:
        """``message_id`` and every message below it."""
        found, pending = [], [str(message_id)]
        while pending:
            current = pending.pop()
            found.append(current)
            pending.extend(self.children.get(current, ()))
        return found


def tree_of(conversation_id: Any) -> Tree:
    rows = (
        Message.objects.filter(conversation_id=conversation_id)
        .order_by("created_at", "id")
        .values_list("id", "parent_id")
    )
    return Tree(rows)


def sibling_ids(conversation_id: Any, parent_id: Any) -> list[str]:
    """The children of ``parent_id`` (roots when ``None``) in creation order: one message's
    siblings without building the whole tree."""
    rows = Message.objects.filter(conversation_id=conversation_id, parent_id=parent_id)
    return [str(i) for i in rows.order_by("created_at", "id").values_list("id", flat=True)]


class History:
    """A conversation's messages, with what a prompt needs (``statements.PROMPT_FIELDS``),
    and their tree: one query for both the prompt of a new answer and its siblings."""

    def __init__(self, messages: Iterable[Message]) -> None:
        """``messages``: every message of the conversation, oldest first."""
        self.messages = {str(m.id): m for m in messages}
        self.tree = Tree((key, m.parent_id) for key, m in self.messages.items())

    @classmethod
    def of(cls, conversation_id: Any) -> History:
        return cls(statements.messages_of(conversation_id))

    def path(self, message_id: Any) -> list[Message]:
        """The messages from the first down to ``message_id``; none for ``None``."""
        if message_id is None:
            return []
        return [self.messages[key] for key in self.tree.path(message_id)]

    def children(self, parent_id: Any) -> list[str]:
        return self.tree.children_of(parent_id)
