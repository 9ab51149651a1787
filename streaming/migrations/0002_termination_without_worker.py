"""Take the generating process out of the termination records already stored.

Host and pid are an operator's fact: they stay on each Segment (the admin and the reaper
read them there) and are no longer part of the record users get. Reversing puts each
message's last segment's worker back into its record.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def drop_worker(apps: Any, schema_editor: Any) -> None:
    Message = apps.get_model("streaming", "Message")
    changed = []
    for message in Message.objects.filter(termination__has_key="worker").iterator():
        message.termination.pop("worker", None)
        changed.append(message)
    Message.objects.bulk_update(changed, ["termination"], batch_size=500)


def restore_worker(apps: Any, schema_editor: Any) -> None:
    Message = apps.get_model("streaming", "Message")
    Segment = apps.get_model("streaming", "Segment")
    changed = []
    for message in Message.objects.exclude(termination={}).iterator():
        last = Segment.objects.filter(message=message).order_by("-index").first()
        message.termination["worker"] = last.worker if last is not None else ""
        changed.append(message)
    Message.objects.bulk_update(changed, ["termination"], batch_size=500)


class Migration(migrations.Migration):
    dependencies = [("streaming", "0001_initial")]

    operations = [migrations.RunPython(drop_worker, restore_worker)]
