"""Facts the API does not show users, read from the database the servers under test share.

Which process generated a segment is an operator's fact (the admin shows it); tests that
check a resume or a Continue crossed processes read it here instead of from the API.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async

from streaming.models import Segment


@sync_to_async
def segment_workers(message_id: str) -> list[str]:
    """The generating process of each segment of a message, in segment order."""
    rows = Segment.objects.filter(message_id=message_id).order_by("index")
    return list(rows.values_list("worker", flat=True))
