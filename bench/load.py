"""The load generator: many streams, each a small state machine over one connection.

A ``StreamPlan`` says what one simulated user does (which server, which transport, when
to start, what to do after ``act_after`` deltas: keep reading, disconnect, resume, stop
reading); a ``StreamResult`` is what the client saw, with wall-clock stamps so results
from several load processes and the servers' emit stamps share one clock.

``run`` drives a list of plans on one event loop; ``run_in_processes`` splits them over
several processes, so the load generator is not the bottleneck it measures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.clients import Http, HttpError, WebSocket, sse_events

# What a stream does once it has seen ``act_after`` deltas.
READ = "read"  # read to the end
DISCONNECT = "disconnect"  # close the connection (the server should abort the engine)
RESUME = "resume"  # close, reconnect at once from the last event id, read to the end
STOP_READING = "stop_reading"  # keep the socket open until ``hold_until``, never reading


@dataclass(slots=True)
class StreamPlan:
    transport: str  # "sse", "ws" or "relay"
    host: str
    port: int
    token: str
    conversation: str
    start_at: float  # wall clock
    simulation: dict[str, Any]
    content: str = "Tell me something."
    action: str = READ
    act_after: int = 0
    deadline: float = 0.0  # wall clock; give up (an error) after it
    hold_until: float = 0.0  # STOP_READING: wall clock when the idle socket is closed
    rcvbuf: int | None = None
    # Set: read this existing message from its first event (a replay) instead of creating one.
    message_id: str = ""
    # A closed-loop user (``run_users``): after each answer, think ``think`` seconds (0.5 to
    # 1.5 times, at random) and send the next, until the wall clock passes ``until``.
    think: float = 0.0
    until: float = 0.0
    # A closed-loop user sends each answer's request on the connection the previous answer
    # came over, as the chat page keeps its WebSocket and a browser (or the OpenAI SDK) its
    # HTTP/1.1 connection; False: a new connection per answer.
    keep: bool = False
    # Each message post over SSE carries an ``Idempotency-Key`` of its own.
    keyed: bool = False


@dataclass(slots=True)
class StreamResult:
    transport: str
    message_id: str = ""
    error: str | None = None
    status: str | None = None  # the termination status in ``done``
    sent_at: float = 0.0  # the POST / message.create went out
    accepted_at: float = 0.0  # its answer arrived
    first_delta_at: float = 0.0
    last_at: float = 0.0  # the last delta arrived
    closed_at: float = 0.0  # DISCONNECT / RESUME: when this client closed
    resumed_first_at: float = 0.0  # RESUME: the first replayed event arrived
    resume_started_at: float = 0.0
    # RESUME: the engine's emit stamp of that event, when it has one (a delta)
    resumed_first_emitted: float = 0.0
    tokens: int = 0
    frames: int = 0
    text: str = ""
    gaps: list[float] = field(default_factory=list)  # ms between delta frames
    latencies: list[float] = field(default_factory=list)  # ms, receive minus emit stamp


class Held:
    """The connection a closed-loop user keeps between answers. ``reusable`` is set by a
    runner that read its response to the end (nothing of it left on the connection)."""

    __slots__ = ("http", "reusable", "ws")

    def __init__(self) -> None:
        self.http: Http | None = None
        self.ws: WebSocket | None = None
        self.reusable = False

    async def open_http(self, plan: StreamPlan) -> Http:
        http = self.http
        if http is None or http.reader.at_eof():
            if http is not None:
                http.close()
            http = self.http = await Http.open(plan.host, plan.port, plan.rcvbuf)
        self.reusable = False
        return http

    async def open_ws(self, plan: StreamPlan) -> WebSocket:
        ws = self.ws
        if ws is None or ws.http.reader.at_eof():
            if ws is not None:
                ws.close()
            ws = self.ws = await WebSocket.open(plan.host, plan.port, "/ws/chat/", plan.token)
        self.reusable = False
        return ws

    def close(self) -> None:
        for connection in (self.http, self.ws):
            if connection is not None:
                connection.close()
        self.http = self.ws = None


def _params(plan: StreamPlan) -> dict[str, Any]:
    """``simulation`` only when there is one: other engines refuse the key."""
    return {"simulation": plan.simulation} if plan.simulation else {}


class Tracker:
    """Per-stream bookkeeping of delta frames as they arrive."""

    __slots__ = ("last_at", "parts", "result", "seq")

    def __init__(self, result: StreamResult) -> None:
        self.result = result
        self.seq = 0
        self.last_at = 0.0
        self.parts: list[str] = []

    def event(self, event: dict[str, Any], at: float) -> bool:
        """Record one event; True when it ends the stream."""
        r = self.result
        kind = event.get("type")
        seq = event.get("seq", self.seq)
        if kind == "delta":
            # A log event may carry several tokens (write-side coalescing), and a token that
            # ends inside a character carries no text: the seq span is a floor, replaced by
            # the engine's own count of tokens when the segment ends (the relay's `done`
            # tells its engine's count too, so both sides count the same tokens).
            r.tokens += seq - self.seq if self.seq else 1
            r.frames += 1
            self.parts.append(event["text"])
            if not r.first_delta_at:
                r.first_delta_at = at
            elif self.last_at:
                r.gaps.append((at - self.last_at) * 1000)
            self.last_at = r.last_at = at
            stamp = event.get("t")
            if stamp is not None:
                r.latencies.append((at - stamp) * 1000)
        elif kind == "error" and "seq" not in event:
            raise RuntimeError(f"error frame: {event}")
        elif kind == "done":
            r.status = event.get("status")
            counted = event.get("completion_tokens")
            if isinstance(counted, int) and counted > 0:
                r.tokens = counted
            self.seq = seq
            return True
        self.seq = seq
        return False

    def relay_token(self, payload: dict[str, Any], at: float) -> bool:
        r = self.result
        if payload.get("done"):
            r.status = "complete"
            if isinstance(payload.get("tokens"), int) and payload["tokens"] > 0:
                r.tokens = payload["tokens"]
            return True
        if "error" in payload:
            raise RuntimeError(f"relay error: {payload['error']}")
        r.tokens += 1
        r.frames += 1
        self.parts.append(payload["token"])
        if not r.first_delta_at:
            r.first_delta_at = at
        elif self.last_at:
            r.gaps.append((at - self.last_at) * 1000)
        self.last_at = r.last_at = at
        if payload.get("t") is not None:
            r.latencies.append((at - payload["t"]) * 1000)
        return False

    def deltas(self) -> int:
        return len(self.parts)


async def _sse(plan: StreamPlan, result: StreamResult, held: Held) -> None:
    """A stream read over SSE. A new answer is asked for in one request, as the chat page
    asks (``Accept: text/event-stream`` on the POST: the stream is its response, the
    created ids its first event); a resume is a GET of the stream with ``Last-Event-ID``."""
    http = await held.open_http(plan)
    tracker = Tracker(result)
    headers = {"Authorization": f"Token {plan.token}", "Accept": "text/event-stream"}
    try:
        if plan.message_id:
            result.sent_at = result.accepted_at = time.time()
            result.message_id = plan.message_id
            http.send("GET", f"/api/messages/{plan.message_id}/stream/", headers)
            head = await _stream_head(http)
        else:
            body = json.dumps({"content": plan.content, "params": _params(plan)}).encode()
            posting = {**headers, "Content-Type": "application/json"}
            if plan.keyed:
                posting["Idempotency-Key"] = uuid.uuid4().hex
            async with _Creating():
                result.sent_at = time.time()
                http.send(
                    "POST", f"/api/conversations/{plan.conversation}/messages/", posting, body
                )
                head = await _stream_head(http)
        if head is None:
            held.reusable = True
            return
        if await _read_sse(http, plan, head, tracker, None, held):
            await _hold(plan)
            return
        # DISCONNECT / RESUME: the connection was closed after act_after deltas.
        if plan.action == RESUME:
            result.resume_started_at = time.time()
            held.close()
            http = await held.open_http(plan)
            resume = {**headers, "Last-Event-ID": str(tracker.seq)}
            http.send("GET", f"/api/messages/{result.message_id}/stream/", resume)
            head = await _stream_head(http)
            if head is not None:
                await _read_sse(http, plan, head, tracker, tracker.seq, held)
    finally:
        result.text = "".join(tracker.parts)


async def _stream_head(http: Http) -> dict[str, str] | None:
    """The head of a stream's response; None for a 204 (nothing more to read)."""
    status, head = await http.head()
    if status == 204:
        return None
    if status != 200:
        raise HttpError(status, b"")
    return head


async def _read_sse(
    http: Http,
    plan: StreamPlan,
    head: dict[str, str],
    tracker: Tracker,
    after: int | None,
    held: Held,
) -> bool:
    """Read a stream; True when it reached ``done`` (or was given up on purpose). After
    ``done`` the rest of the response is read, so the connection can carry the next."""
    result = tracker.result
    buffer = bytearray()
    acting = after is None and plan.action != READ
    body = http.body(head)
    async for data, at in body:
        for event in sse_events(buffer, data):
            if "message" in event and "type" not in event:  # the one-step `created` event
                result.accepted_at = at
                result.message_id = event["message"]["id"]
                continue
            if after is not None and not result.resumed_first_at:
                result.resumed_first_at = at
                result.resumed_first_emitted = event.get("t") or 0.0
            if tracker.event(event, at):
                async for _ in body:
                    pass
                held.reusable = True
                return True
            if acting and tracker.deltas() >= plan.act_after:
                return _act(http, plan, result)
    raise RuntimeError("the stream ended without done")


def _act(http: Http, plan: StreamPlan, result: StreamResult) -> bool:
    result.closed_at = time.time()
    if plan.action == STOP_READING:
        http.writer.transport.pause_reading()  # type: ignore[attr-defined]
        return True
    http.close()
    return plan.action == DISCONNECT


async def _hold(plan: StreamPlan) -> None:
    if plan.action == STOP_READING:
        await asyncio.sleep(max(plan.hold_until - time.time(), 0))


async def _ws(plan: StreamPlan, result: StreamResult, held: Held) -> None:
    ws = await held.open_ws(plan)
    tracker = Tracker(result)
    try:
        result.sent_at = time.time()
        if plan.message_id:
            result.accepted_at = result.sent_at
            result.message_id = plan.message_id
            ws.send_json({"type": "subscribe", "message_id": plan.message_id, "after": 0})
        else:
            ws.send_json(
                {
                    "type": "message.create",
                    "conversation": plan.conversation,
                    "content": plan.content,
                    "params": _params(plan),
                }
            )
        if await _read_ws(ws, plan, tracker, resumed=False, held=held):
            await _hold(plan)
            return
        if plan.action == RESUME:
            result.resume_started_at = time.time()
            held.close()
            ws = await held.open_ws(plan)
            after = tracker.seq
            ws.send_json({"type": "subscribe", "message_id": result.message_id, "after": after})
            await _read_ws(ws, plan, tracker, resumed=True, held=held)
    finally:
        result.text = "".join(tracker.parts)


async def _read_ws(
    ws: WebSocket, plan: StreamPlan, tracker: Tracker, resumed: bool, held: Held
) -> bool:
    result = tracker.result
    acting = not resumed and plan.action != READ
    async for batch, at in ws.frames():
        for i, frame in enumerate(batch):
            kind = frame.get("type")
            if kind == "message.created":
                result.accepted_at = at
                result.message_id = frame["message_id"]
                continue
            if kind in ("subscribed", "heartbeat", "pong"):
                continue
            if kind == "error" and "seq" not in frame:
                raise RuntimeError(f"error frame: {frame}")
            if resumed and not result.resumed_first_at:
                result.resumed_first_at = at
                result.resumed_first_emitted = frame.get("t") or 0.0
            if tracker.event(frame, at):
                ws.pending = batch[i + 1 :]
                held.reusable = True
                return True
            if acting and tracker.deltas() >= plan.act_after:
                return _act(ws.http, plan, result)
    raise RuntimeError(f"the socket closed without done (code {ws.closed_code})")


async def _relay(plan: StreamPlan, result: StreamResult, held: Held) -> None:
    """The baseline's reference shape: one POST answered by ``data: {"token": ...}``."""
    http = await held.open_http(plan)
    tracker = Tracker(result)
    try:
        body = {"content": plan.content, "simulation": plan.simulation}
        result.sent_at = time.time()
        http.send(
            "POST", "/stream", {"Content-Type": "application/json"}, json.dumps(body).encode()
        )
        status, head = await http.head()
        result.accepted_at = time.time()
        if status != 200:
            raise HttpError(status, b"")
        result.message_id = head.get("x-request-id", "")
        buffer = bytearray()
        acting = plan.action != READ
        chunks = http.body(head)
        async for data, at in chunks:
            for payload in sse_events(buffer, data):
                if tracker.relay_token(payload, at):
                    async for _ in chunks:
                        pass
                    held.reusable = True
                    return
                if acting and tracker.deltas() >= plan.act_after:
                    _act(http, plan, result)
                    await _hold(plan)
                    return
        raise RuntimeError("the relay stream ended without done")
    finally:
        result.text = "".join(tracker.parts)


RUNNERS = {"sse": _sse, "ws": _ws, "relay": _relay}


async def run_one(plan: StreamPlan, held: Held | None = None) -> StreamResult:
    """One answer; over ``held``'s connection when the plan keeps it (left open for the
    next answer when this one was read to its end), else over a connection of its own."""
    held = held or Held()
    result = StreamResult(plan.transport)
    delay = plan.start_at - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
    try:
        timeout = plan.deadline - time.time() if plan.deadline else None
        async with asyncio.timeout(timeout):
            await RUNNERS[plan.transport](plan, result, held)
    except TimeoutError:
        result.error = "timeout"
    except Exception as exc:
        result.error = f"{exc.__class__.__name__}: {exc}"[:300]
    if not (plan.keep and held.reusable and result.error is None):
        held.close()
    return result


async def run(plans: list[StreamPlan], creates_in_flight: int = 0) -> list[StreamResult]:
    """Run every plan; ``creates_in_flight`` > 0 bounds how many message creations wait
    for their answer at once (see docs/reliability.md on concurrent REST POSTs)."""
    global _creates
    _creates = asyncio.Semaphore(creates_in_flight) if creates_in_flight else None
    return list(await asyncio.gather(*(run_one(p) for p in plans)))


_creates: asyncio.Semaphore | None = None


async def run_user(plan: StreamPlan) -> list[StreamResult]:
    """One closed-loop user: answer after answer, with think time between, until
    ``plan.until``. Every answer's result, in order."""
    rng = random.Random(f"{plan.port}:{plan.conversation}:{plan.start_at}")
    budget = plan.deadline - plan.start_at if plan.deadline else 120.0
    results: list[StreamResult] = []
    start = plan.start_at
    held = Held()
    while True:
        one = dataclasses.replace(plan, start_at=start, deadline=start + budget)
        results.append(await run_one(one, held))
        start = time.time() + plan.think * rng.uniform(0.5, 1.5)
        if start >= plan.until:
            held.close()
            return results


def _run_user_slice(plans: list[StreamPlan]) -> list[StreamResult]:
    async def users() -> list[list[StreamResult]]:
        return list(await asyncio.gather(*(run_user(p) for p in plans)))

    return [r for user in asyncio.run(users()) for r in user]


def run_users(
    plans: list[StreamPlan],
    processes: int,
    samples: list[tuple[float, Callable[[], None]]] = (),  # type: ignore[assignment]
) -> list[StreamResult]:
    """``run_user`` for every plan over ``processes`` load processes; the results of all
    answers (in no particular order). ``samples`` as for ``run_in_processes``."""
    processes = max(1, min(processes, len(plans)))
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        pending = pool.map_async(_run_user_slice, [plans[i::processes] for i in range(processes)])
        for at, callback in sorted(samples, key=lambda pair: pair[0]):
            delay = at - time.time()
            if delay > 0 and not pending.ready():
                pending.wait(delay)
            callback()
        return [r for part in pending.get() for r in part]


class _Creating:
    async def __aenter__(self) -> None:
        if _creates is not None:
            await _creates.acquire()

    async def __aexit__(self, *exc: object) -> None:
        if _creates is not None:
            _creates.release()


def _run_slice(job: tuple[list[StreamPlan], int]) -> list[StreamResult]:
    plans, creates_in_flight = job
    return asyncio.run(run(plans, creates_in_flight))


def run_in_processes(
    plans: list[StreamPlan],
    processes: int,
    samples: list[tuple[float, Callable[[], None]]] = (),  # type: ignore[assignment]
    creates_in_flight: int = 0,
) -> list[StreamResult]:
    """Interleave the plans over ``processes`` load processes; results in plan order.

    ``samples`` are (wall clock, callback) pairs run in this process while the load runs:
    how the harness reads the servers' /proc figures in the middle of a scenario.
    """
    processes = max(1, min(processes, len(plans)))
    per_process = -(-creates_in_flight // processes) if creates_in_flight else 0
    slices = [(plans[i::processes], per_process) for i in range(processes)]
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        pending = pool.map_async(_run_slice, slices)
        for at, callback in sorted(samples, key=lambda pair: pair[0]):
            delay = at - time.time()
            if delay > 0 and not pending.ready():
                pending.wait(delay)
            callback()
        parts = pending.get()
    results: list[StreamResult] = [StreamResult("")] * len(plans)
    for i, part in enumerate(parts):
        for j, result in enumerate(part):
            results[i + j * processes] = result
    return results
