"""Ids as the REST paths spell them (``<uuid:...>``: lowercase hex with hyphens).

Every entry point that takes an id outside a path (WebSocket frames, ``/v1``'s
``X-Conversation-Id``) holds it to the same spelling, so that all of them agree on what
exists: an id the paths answer 404 names nothing anywhere, and one message has one key
(a subscription's, an idempotent retry's).
"""

from __future__ import annotations

import re

from django.urls.converters import UUIDConverter

_ID = re.compile(UUIDConverter.regex)


def spelled_as_paths_take(value: str) -> bool:
    return _ID.fullmatch(value) is not None
