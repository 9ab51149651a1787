"""Signals the streaming layers send upward, so they never import the services.

``answer_interrupted``: the reaper finalised a segment of a dead process as
``interrupted`` (``message_id``). ``streaming.apps`` connects the services' automatic
Continue to it (``AUTO_CONTINUE_INTERRUPTED``).
"""

from __future__ import annotations

from django.dispatch import Signal

answer_interrupted = Signal()
