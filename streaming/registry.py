"""The generations running in this process, and where a cancel or a reader count goes.

``Generations`` is the one place that knows whether a message is generated here: a cancel
for a local generation is a call, for any other it is a control message to every process
(the one running it acts); a change of readers reaches the local generation directly, a
remote one over control. It is the presence backend's listener and control's handler.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from streaming.control.base import Control
from streaming.generation import Backends, Generation, SegmentPlan

CANCEL = "generation.cancel"
READERS = "generation.readers"


class Generations:
    def __init__(self, control: Control) -> None:
        self.control = control
        self.running: dict[str, Generation] = {}

    def __len__(self) -> int:
        return len(self.running)

    def __iter__(self) -> Iterator[Generation]:
        return iter(list(self.running.values()))

    def get(self, message_id: str) -> Generation | None:
        return self.running.get(message_id)

    def streaming(self, message_id: str) -> Generation | None:
        """The generation of ``message_id`` while it streams here (``Generation.streaming``)."""
        generation = self.running.get(message_id)
        return generation if generation is not None and generation.streaming else None

    def prepare(self, plan: SegmentPlan, backends: Backends) -> Generation:
        """The generation of ``plan``, not started: made in any thread (it touches no
        loop), then ``start``-ed on the loop."""
        return Generation(plan, backends, on_end=self._ended)

    def start(self, generation: Generation) -> None:
        """Register ``generation`` and start it as a task of the running loop; it leaves
        the registry when it ends."""
        self.running[generation.message_id] = generation
        generation.start()

    def launch(self, plan: SegmentPlan, backends: Backends) -> Generation:
        """``prepare`` then ``start``, on the running loop."""
        generation = self.prepare(plan, backends)
        self.start(generation)
        return generation

    def _ended(self, generation: Generation) -> None:
        if self.running.get(generation.message_id) is generation:
            del self.running[generation.message_id]

    async def cancel(self, message_id: str, reason: str, segment: int | None = None) -> None:
        """End a generation wherever it runs (this process or another). ``segment``: only
        while it generates that segment of the message, the one its caller saw streaming;
        a later one, a Continue's started meanwhile, is not stopped behind their back.
        None: whichever segment it generates. A local generation of another segment (one
        ending here) does not keep the cancel from the process that may generate it."""
        generation = self.running.get(message_id)
        if generation is not None and _generates(generation, segment):
            generation.cancel(reason)
            return
        message: dict[str, Any] = {"type": CANCEL, "reason": reason}
        if segment is not None:
            message["segment"] = segment
        await self.control.send(message_id, message)

    # --- presence's listener -------------------------------------------------------------
    def generating(self, message_id: str) -> bool:
        return message_id in self.running

    def readers_changed(self, message_id: str, count: int) -> None:
        generation = self.running.get(message_id)
        if generation is not None:
            generation.readers_changed(count)

    async def notify_remote(self, message_id: str) -> None:
        await self.control.send(message_id, {"type": READERS})

    # --- control's handler ---------------------------------------------------------------
    async def on_control(self, message: dict[str, Any]) -> None:
        generation = self.running.get(message.get("mid", ""))
        if generation is None:
            return
        kind = message.get("type")
        if kind == CANCEL:
            if _generates(generation, message.get("segment")):
                generation.cancel(message.get("reason", "cancelled"))
        elif kind == READERS:
            # Only a process with readers of it sends this: it is followed from there.
            generation.followed_elsewhere()
            await generation.recount_readers()


def _generates(generation: Generation, segment: Any) -> bool:
    """Whether ``generation`` is of ``segment`` (None: of any)."""
    return segment is None or generation.plan.segment_index == segment
