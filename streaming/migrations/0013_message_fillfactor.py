"""Leave room in the messages' pages for the versions the write-behind writes.

An answer's row is rewritten several times while it streams (``persistence.flush_partials``
writes its text so far every ``STREAM_FLUSH_INTERVAL``), a change of no indexed column,
which PostgreSQL stores as a heap-only tuple, with no new entry in any of the table's
indexes, only when the row's page has room for the new version. At the default fill
factor (100) inserts fill the pages, and nearly every such rewrite added an entry to six
of the table's seven indexes, and the old version stayed behind until a vacuum. At 70 an
insert leaves almost a third of each page free, and on-page pruning makes room again from
the dead versions without a vacuum (docs/performance.md: half the rewrites of a *users*
run stay out of the indexes, from 4 %, and the table ends it 40 % smaller). Pages already
full keep their rows until they are rewritten. Other databases: nothing to do.
"""

from django.db import migrations

FILL_FACTOR = 70


def _alter(apps, schema_editor, change):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("streaming", "Message")._meta.db_table)
    schema_editor.execute(f"ALTER TABLE {table} {change}")


def _set(apps, schema_editor):
    _alter(apps, schema_editor, f"SET (fillfactor = {FILL_FACTOR})")


def _reset(apps, schema_editor):
    _alter(apps, schema_editor, "RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [("streaming", "0012_segment_streaming_worker")]

    operations = [migrations.RunPython(_set, _reset)]
