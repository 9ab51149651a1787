"""Conversations stored before trees become one branch each, and their titles the person's.

Each message's parent is the one before it (by creation) and the conversation's current
leaf its last message, so it reads back exactly as it did. A stored title counts as the
person's, so an engine's title never replaces it; an empty one as none yet. Reversing
leaves the rows (0003's reverse drops the columns).
"""

from __future__ import annotations

import itertools
from typing import Any

from django.db import migrations


def link_linear_conversations(apps: Any, schema_editor: Any) -> None:
    Conversation = apps.get_model("streaming", "Conversation")
    Message = apps.get_model("streaming", "Message")
    for conversation_id in Conversation.objects.values_list("id", flat=True).iterator():
        ids = list(
            Message.objects.filter(conversation_id=conversation_id)
            .order_by("created_at", "id")
            .values_list("id", flat=True)
        )
        for parent_id, message_id in itertools.pairwise(ids):
            Message.objects.filter(id=message_id).update(parent_id=parent_id)
        if ids:
            Conversation.objects.filter(id=conversation_id).update(current_leaf_id=ids[-1])
    Conversation.objects.exclude(title="").update(title_source="user")


class Migration(migrations.Migration):
    dependencies = [("streaming", "0003_message_tree")]

    operations = [migrations.RunPython(link_linear_conversations, migrations.RunPython.noop)]
