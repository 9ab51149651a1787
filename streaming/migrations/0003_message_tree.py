"""Conversations become trees: every message gets a parent, every conversation a leaf;
and titles say who wrote them. The rows stored before are linked in 0004 (data apart
from schema: PostgreSQL cannot build the deferred indexes over rows changed in the same
transaction). Reversing drops the three columns.
"""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models


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
        migrations.AddField(
            model_name="conversation",
            name="title_source",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "None yet"),
                    ("question", "The first question's first line"),
                    ("model", "Written by the engine"),
                    ("user", "Set by the person"),
                ],
                default="",
                max_length=16,
            ),
        ),
    ]
