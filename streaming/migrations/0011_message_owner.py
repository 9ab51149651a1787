"""Each message keeps its conversation's owner, so a user's running answers are counted
from an index of them (``msg_owner_streaming``) instead of through every conversation
the user ever had. Existing messages get their conversation's owner (one pass over the
table); reversing drops the column."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

import streaming.models

BACKFILL = (
    "UPDATE streaming_message SET owner_id = ("
    "SELECT owner_id FROM streaming_conversation"
    " WHERE streaming_conversation.id = streaming_message.conversation_id)"
)


def _owner(*, null: bool) -> streaming.models.ConversationOwner:
    return streaming.models.ConversationOwner(
        db_index=False,
        editable=False,
        null=null,
        on_delete=django.db.models.deletion.DO_NOTHING,
        related_name="+",
        to=settings.AUTH_USER_MODEL,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("streaming", "0010_redundant_indexes"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(model_name="message", name="owner", field=_owner(null=True)),
        migrations.RunSQL(BACKFILL, reverse_sql=migrations.RunSQL.noop),
        migrations.AlterField(model_name="message", name="owner", field=_owner(null=False)),
        migrations.AddIndex(
            model_name="message",
            index=models.Index(
                condition=models.Q(("status", "streaming")),
                fields=["owner"],
                name="msg_owner_streaming",
            ),
        ),
    ]
