"""Conversations become trees: every message gets a parent, every conversation a leaf.

A conversation stored before this is one branch: each message's parent is the one before
it (by creation), and its current leaf is its last message, so it reads back exactly as it
did. Reversing drops both columns.
"""

from __future__ import annotations

from typing import Any

import django.db.models.deletion
from django.db import migrations, models


def link_linear_conversations(apps: Any, schema_editor: Any) -> None:
    Conversation = apps.get_model("streaming", "Conversation")
    Message = apps.get_model("streaming", "Message")
    for conversation_id in Conversation.objects.values_list("id", flat=True).iterator():
        ids = list(
            Message.objects.filter(conversation_id=conversation_id)
            .order_by("created_at", "id")
            .values_list("id", flat=True)
        )
        for parent_id, message_id in zip(ids, ids[1:], strict=False):
            Message.objects.filter(id=message_id).update(parent_id=parent_id)
        if ids:
            Conversation.objects.filter(id=conversation_id).update(current_leaf_id=ids[-1])


class Migration(migrations.Migration):
    dependencies = [("streaming", "0002_termination_without_worker")]

    operations = [
        migrations.AddField(
            model_name="conversation",
            name="current_leaf",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="streaming.message",
            ),
        ),
        migrations.AddField(
            model_name="message",
            name="parent",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="children",
                to="streaming.message",
            ),
        ),
        migrations.RunPython(link_linear_conversations, migrations.RunPython.noop),
    ]
