"""Drop the indexes that another index's first column already covers.

The foreign keys' own indexes are dropped with ``DROP INDEX`` alone: ``AlterField``
would drop and re-add each constraint, which checks every row of the table again under
a lock. Reversing creates them again, under the names Django gave them.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

STATUSES = [
    ("streaming", "Streaming"),
    ("complete", "Complete"),
    ("truncated", "Truncated (max tokens)"),
    ("stopped", "Stopped (stop sequence)"),
    ("cancelled", "Cancelled by the user"),
    ("abandoned", "Abandoned (no reader left)"),
    ("error", "Engine or server error"),
    ("stalled", "Stalled (no tokens)"),
    ("interrupted", "Interrupted (process died)"),
]
# (model, field, table, column, the index Django made for the foreign key)
FOREIGN_KEY_INDEXES = [
    (
        "conversation",
        "owner",
        "streaming_conversation",
        "owner_id",
        "streaming_conversation_owner_id_b4bde1ea",
    ),
    (
        "message",
        "conversation",
        "streaming_message",
        "conversation_id",
        "streaming_message_conversation_id_453f75f7",
    ),
    (
        "segment",
        "message",
        "streaming_segment",
        "message_id",
        "streaming_segment_message_id_fc8fa5ce",
    ),
]
TARGETS = {
    "owner": (settings.AUTH_USER_MODEL, "conversations"),
    "conversation": ("streaming.conversation", "messages"),
    "message": ("streaming.message", "segments"),
}


def _without_index(model: str, field: str, table: str, column: str, index: str):
    to, related_name = TARGETS[field]
    return migrations.SeparateDatabaseAndState(
        state_operations=[
            migrations.AlterField(
                model_name=model,
                name=field,
                field=models.ForeignKey(
                    db_index=False,
                    on_delete=django.db.models.deletion.CASCADE,
                    related_name=related_name,
                    to=to,
                ),
            )
        ],
        database_operations=[
            migrations.RunSQL(
                f'DROP INDEX IF EXISTS "{index}"',
                reverse_sql=f'CREATE INDEX "{index}" ON "{table}" ("{column}")',
            )
        ],
    )


class Migration(migrations.Migration):
    dependencies = [
        ("streaming", "0009_message_idempotency_key"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        *(_without_index(*entry) for entry in FOREIGN_KEY_INDEXES),
        migrations.AlterField(
            model_name="message",
            name="status",
            field=models.CharField(choices=STATUSES, default="complete", max_length=16),
        ),
        migrations.AlterField(
            model_name="segment",
            name="status",
            field=models.CharField(choices=STATUSES, default="streaming", max_length=16),
        ),
        migrations.AlterField(
            model_name="segment",
            name="worker",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
    ]
