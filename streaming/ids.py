"""Ids as the REST paths spell them (``<uuid:...>``: lowercase hex with hyphens).

Every entry point that takes an id outside a path (WebSocket frames, ``/v1``'s
``X-Conversation-Id``, a request body's ``parent_id`` and ``current_leaf``) holds it to
the same spelling, so that all of them agree on what exists: an id the paths answer 404
names nothing anywhere, and one message has one key (a subscription's, an idempotent
retry's). An id looked up by itself (a frame's ``message_id`` or ``conversation``, the
header) is checked with ``spelled_as_paths_take`` before it is looked up; a body's id,
one of a conversation's messages, is kept as sent and looked up among their ids as the
paths spell them, so that another spelling is refused exactly as an unknown id is.
"""

from __future__ import annotations

import re

from django.urls.converters import UUIDConverter

_ID = re.compile(UUIDConverter.regex)


def spelled_as_paths_take(value: str) -> bool:
    return _ID.fullmatch(value) is not None
