"""Helpers for the unit tests of the generation, registry, presence, reaper and reading.

``ScriptedEngine`` is a stand-in for the model server (the ``Engine`` protocol of
``streaming.engines.base``): it plays a script of chunks, gates the test opens, exceptions
and calls, and records how far it got and whether its stream was closed. Everything else
the tests use is the real thing: the in-memory log, the hub, the presence backends, the
registry and control over the configured channel layer, and the database.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import User

from streaming import database, events
from streaming.control.base import Control, Handler
from streaming.control.memory import MemoryControl
from streaming.engines.base import ChatTurn, EngineChunk, EngineRequest, ModelInfo
from streaming.generation import SegmentPlan
from streaming.models import Conversation, Message, Segment
from streaming.termination import Status, Termination

MODEL = "scripted-model"


class Gate:
    """A point in a script where the engine waits until the test opens it.

    ``reached`` is set once the engine waits there: from then on the generation is
    waiting on the engine (inside its ``anext``)."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.opened = asyncio.Event()

    def open(self) -> None:
        self.opened.set()


@dataclass(frozen=True)
class Do:
    """Run ``action`` inside the engine's stream, between two chunks."""

    action: Callable[[], Any]


Step = EngineChunk | Gate | Do | BaseException


@dataclass
class ScriptedEngine:
    script: list[Step]
    name: str = "scripted"
    model: str = MODEL
    accepts_simulation: bool = False
    requests: list[EngineRequest] = field(default_factory=list)
    steps_run: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    async def stream(self, request: EngineRequest) -> AsyncGenerator[EngineChunk, None]:
        self.requests.append(request)
        try:
            for step in self.script:
                self.steps_run += 1
                if isinstance(step, Gate):
                    step.reached.set()
                    await step.opened.wait()
                elif isinstance(step, Do):
                    step.action()
                elif isinstance(step, BaseException):
                    raise step
                else:
                    yield step
        finally:
            self.closed.set()

    async def models(self) -> list[ModelInfo]:
        return [ModelInfo(self.model, "tests")]

    async def health(self) -> bool:
        return True


def chunk(text: str = "", **kwargs: Any) -> EngineChunk:
    """A text chunk of one token (``tokens=0`` for a bookkeeping chunk)."""
    kwargs.setdefault("tokens", 1 if text else 0)
    return EngineChunk(text=text, **kwargs)


# --- database rows ---------------------------------------------------------------------
@dataclass(frozen=True)
class Answer:
    message_id: str
    conversation_id: str
    user_id: int


def _create_answer(worker: str, content: str, last_seq: int, first_seq: int) -> Answer:
    user = User.objects.create_user(f"u-{uuid.uuid4().hex[:16]}")
    conversation = Conversation.objects.create(owner=user)
    message = Message.objects.create(
        conversation=conversation,
        role=Message.Role.ASSISTANT,
        status=Status.STREAMING,
        content=content,
        last_seq=last_seq,
    )
    Segment.objects.create(message=message, index=0, first_seq=first_seq, worker=worker)
    return Answer(str(message.id), str(conversation.id), user.pk)


async def create_answer(
    worker: str, *, content: str = "", last_seq: int = 0, first_seq: int = 1
) -> Answer:
    """A user, a conversation and a streaming assistant message with its segment 0."""
    return await database.run(_create_answer, worker, content, last_seq, first_seq)


def _add_segment(message_id: str, index: int, first_seq: int, worker: str) -> None:
    Message.objects.filter(id=message_id).update(status=Status.STREAMING)
    Segment.objects.create(message_id=message_id, index=index, first_seq=first_seq, worker=worker)


async def add_segment(message_id: str, index: int, first_seq: int, worker: str) -> None:
    """A Continue: the message streams again, in a new segment."""
    await database.run(_add_segment, message_id, index, first_seq, worker)


async def load_message(message_id: str) -> Message:
    return await database.run(lambda: Message.objects.get(id=message_id))


async def load_segments(message_id: str) -> list[Segment]:
    return await database.run(
        lambda: list(Segment.objects.filter(message_id=message_id).order_by("index"))
    )


def plan_for(
    answer: Answer,
    *,
    stop: list[str] | None = None,
    grace: float = 60.0,
    segment_index: int = 0,
    first_seq: int = 1,
    base_text: str = "",
    base_reasoning: str = "",
    previous_done: events.Event | None = None,
) -> SegmentPlan:
    return SegmentPlan(
        message_id=answer.message_id,
        conversation_id=answer.conversation_id,
        user_id=answer.user_id,
        segment_index=segment_index,
        first_seq=first_seq,
        base_text=base_text,
        base_reasoning=base_reasoning,
        request=EngineRequest(
            messages=[ChatTurn("user", "hello")],
            request_id=f"req-{uuid.uuid4().hex[:8]}",
            stop=list(stop or []),
            continue_final=segment_index > 0,
        ),
        abandon_grace=grace,
        previous_done=previous_done,
    )


def termination_of(done: events.Event) -> dict[str, Any]:
    """The termination record a ``done`` event carries."""
    fields = Termination.__dataclass_fields__
    return {k: v for k, v in done.items() if k in fields}


def texts(batch: list[events.Event]) -> list[str]:
    return [e["text"] for e in batch if e["type"] == events.DELTA]


def thoughts(batch: list[events.Event]) -> list[str]:
    return [e["text"] for e in batch if e["type"] == events.REASONING]


# --- control between processes ---------------------------------------------------------
SENTINEL = "tests.sentinel"


class Wire:
    """What control messages travel over: in memory, the one ``MemoryControl`` of the one
    process; with Redis, a pub/sub channel of the test's own (one client per process)."""

    def __init__(self, kind: str, redis_url: str = "") -> None:
        self.kind = kind
        self.redis_url = redis_url
        self.channel = f"tests:control:{uuid.uuid4().hex}"
        self.made: list[Control] = []

    def control(self) -> Control:
        """The control client of one more process (in memory: always the same one)."""
        if self.kind == "memory":
            if not self.made:
                self.made.append(MemoryControl())
            return self.made[0]
        from streaming.control.redis import RedisControl

        control = RedisControl(location=self.redis_url, channel=self.channel)
        self.made.append(control)
        return control

    async def listen(self, handler: Handler, control: Control | None = None) -> Control:
        """Hand every message to ``handler`` from now on."""
        control = control or self.control()
        await control.start(handler)
        subscribed = getattr(control, "subscribed", None)
        if subscribed is not None:
            await asyncio.wait_for(subscribed.wait(), 10.0)
        return control

    async def close(self) -> None:
        for control in self.made:
            await control.stop()


class Received:
    """A handler that keeps what it is handed (the listening end of a ``Wire``)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._markers: dict[str, asyncio.Event] = {}

    async def __call__(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        marker = self._markers.get(message.get("mid", ""))
        if marker is not None:
            marker.set()

    async def about(self, sender: Control, message_id: str) -> list[dict[str, Any]]:
        """The messages about ``message_id`` so far: a sentinel goes last and is waited for
        (one sender's messages arrive in order)."""
        marker = uuid.uuid4().hex
        arrived = self._markers[marker] = asyncio.Event()
        await sender.send(marker, {"type": SENTINEL})
        await asyncio.wait_for(arrived.wait(), 10.0)
        return [m for m in self.messages if m.get("mid") == message_id]
