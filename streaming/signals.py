"""Signals the streaming layers send upward, so they never import the services.

``answer_interrupted``: the reaper finalised a segment of a dead process as
``interrupted`` (``message_id``). ``streaming.apps`` connects the services' automatic
Continue to it (``AUTO_CONTINUE_INTERRUPTED``).

``answer_ended``: a generation's segment ended and its record is stored (``message_id``,
``segment_index``, ``status``); sent on the generation's loop, so receivers must not block
(``streaming.titling`` starts a title in the background).
"""

from __future__ import annotations

from django.dispatch import Signal

answer_interrupted = Signal()
answer_ended = Signal()
