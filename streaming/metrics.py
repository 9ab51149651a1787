"""Stream metrics: what users feel, which HTTP middleware cannot see.

Channels consumers bypass Django middleware, so django-prometheus never sees a stream;
these are ours. Labels are bounded sets (transport, status, error type, persistence kind) -
never ids. docs/metrics.md lists every name with its labels and meaning.

Several processes: the launcher sets ``PROMETHEUS_MULTIPROC_DIR`` (one directory per host,
shared by that host's processes) before the process starts, because prometheus_client
picks its storage when it is first imported. ``chatsite.asgi`` imports this module before
Django loads, so the directory exists before django-prometheus creates its metrics, and
live gauges left behind by dead processes are dropped before ours exist. Gauges sum over
live processes (``livesum``); counters and histograms keep a dead process's totals, so
they never go backwards.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.multiprocess import mark_process_dead

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiproc_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def forget_dead_processes(*, including_this_one: bool = False) -> list[int]:
    """Drop the live gauges of processes that no longer run; returns their pids.

    A killed process never decrements its open-stream gauge, so without this the sum would
    count its streams forever. ``including_this_one`` is for start-up, before this process
    has any gauge: a file with our pid was left by an earlier process that had the same pid
    (PID 1 in a container restarted in place).
    """
    path = multiproc_dir()
    if path is None:
        return []
    own = os.getpid()
    dead = set()
    for name in glob.glob(os.path.join(path, "gauge_live*_*.db")):
        pid_part = os.path.basename(name)[: -len(".db")].rsplit("_", 1)[-1]
        if not pid_part.isdigit():
            continue
        pid = int(pid_part)
        if (pid == own and including_this_one) or (pid != own and not _alive(pid)):
            dead.add(pid)
    for pid in dead:
        # Another process may be removing the same files at the same moment.
        with contextlib.suppress(FileNotFoundError):
            mark_process_dead(pid, path)
    return sorted(dead)


def prepare_multiprocess() -> None:
    """Create the shared directory and clean it of dead processes' live gauges."""
    path = multiproc_dir()
    if path is None:
        return
    os.makedirs(path, exist_ok=True)
    forget_dead_processes(including_this_one=True)


# Before any metric below exists in this process (their values are files in the directory).
prepare_multiprocess()

# Seconds; dense below one second where TTFT and gaps live.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0,
    5.0, 10.0, 30.0,
)  # fmt: skip

STREAM_TTFT = Histogram(
    "chat_stream_ttft_seconds",
    "Time to first token as the client sees it: stream accepted -> first delta written. "
    "Fresh readers of a running generation only (not resumes, not finished messages).",
    ["transport"],
    buckets=LATENCY_BUCKETS,
)
STREAM_REASONING_TTFT = Histogram(
    "chat_stream_reasoning_ttft_seconds",
    "Time to first reasoning as the client sees it: stream accepted -> first reasoning "
    "event written. Fresh readers of a running generation with reasoning only.",
    ["transport"],
    buckets=LATENCY_BUCKETS,
)
ENGINE_TTFT = Histogram(
    "chat_engine_ttft_seconds",
    "Time to first answer token as the engine gives it: generation start -> the engine's "
    "first token of the answer (reasoning tokens are timed apart).",
    buckets=LATENCY_BUCKETS,
)
ENGINE_REASONING_TTFT = Histogram(
    "chat_engine_reasoning_ttft_seconds",
    "Time to first reasoning token as the engine gives it: generation start -> the "
    "engine's first token of reasoning (answers with reasoning only).",
    buckets=LATENCY_BUCKETS,
)
INTER_TOKEN_GAP = Histogram(
    "chat_stream_write_gap_seconds",
    "Gap between consecutive frames carrying text written to one client (merged deltas).",
    ["transport"],
    buckets=LATENCY_BUCKETS,
)
TOKENS_DELIVERED = Counter(
    "chat_stream_delta_events_delivered_total",
    "Delta events written to clients; one event is one engine chunk, which is one token "
    "except for engines that put several tokens in a chunk.",
    ["transport"],
)
FRAMES_WRITTEN = Counter(
    "chat_stream_frames_written_total",
    "Writes to clients (several events merged into one write count once).",
    ["transport"],
)
STREAM_ENDS = Counter(
    "chat_stream_ends_total",
    "Client streams that ended: the termination status of the segment they saw end, or "
    "'disconnected' (the client left first) or 'slow_consumer' (closed for not reading).",
    ["transport", "status"],
)
STREAMS_ACTIVE = Gauge(
    "chat_streams_active",
    "Open client streams.",
    ["transport"],
    multiprocess_mode="livesum",
)
FEED_LISTENERS = Gauge(
    "chat_feed_listeners",
    "WebSocket sockets subscribed to their user's event feed.",
    multiprocess_mode="livesum",
)
ACTIVE_GENERATIONS = Gauge(
    "chat_generations_active", "Generations running.", multiprocess_mode="livesum"
)
STREAM_GENERATIONS_ENDED = Counter(
    "chat_generations_ended_total", "Generation segments ended, by termination status.", ["status"]
)
GENERATED_TOKENS = Counter(
    "chat_generated_tokens_total", "Completion tokens the engine produced, over all segments."
)
RESUMES = Counter(
    "chat_stream_resumes_total", "Streams opened with a cursor (resume).", ["transport"]
)
EVENTS_REPLAYED = Counter(
    "chat_stream_events_replayed_total",
    "Events a resuming client had missed, sent in its first write.",
    ["transport"],
)
CANCELS = Counter("chat_cancels_total", "Stop requests that ended a running generation.")
ABANDONS = Counter("chat_abandons_total", "Generations aborted because every reader left.")
ENGINE_ERRORS = Counter(
    "chat_engine_errors_total", "Engine failures that ended a segment, by type.", ["type"]
)
SLOW_CONSUMER_CLOSES = Counter(
    "chat_slow_consumer_closes_total",
    "Connections closed because the client stopped reading.",
    ["transport"],
)
PERSIST_LATENCY = Histogram(
    "chat_persist_seconds",
    "Database writes of message content: 'partial' is one write-behind batch, 'final' the "
    "final record of a segment (its `done` event waits for it).",
    ["kind"],
    buckets=LATENCY_BUCKETS,
)
REAPED = Counter("chat_reaped_segments_total", "Segments finalised by a reaper.")
SERVER_HOOKS = Gauge(
    "chat_server_hooks_available",
    "1 while a hook into the server works in every live process, 0 once one process found "
    "it unavailable: one of streaming.transports.daphne.HOOKS (docs/metrics.md lists them).",
    ["hook"],
    multiprocess_mode="livemin",
)
ONE_STEP_POSTS = Counter(
    "chat_one_step_posts_total",
    "POSTs answered with their stream (Accept: text/event-stream), by the path that created "
    "the answer: 'lean' (a message post of a token caller or a signed-in page, without "
    "Django's request cycle; not in django-prometheus's request metrics) or 'django' "
    "(everything else, refusals included).",
    ["path"],
)

# Error types kept as label values; anything else (a remote server's own type strings are
# unbounded) is counted as "other".
ENGINE_ERROR_TYPES = frozenset(
    {
        # ours
        "EngineUnavailable",
        "EngineTimeout",
        "EngineDisconnected",
        "EngineProtocolError",
        "EngineAborted",
        "EngineError",
        "ContextFull",
        # OpenAI's names, which vLLM's error bodies use
        "BadRequestError",
        "AuthenticationError",
        "PermissionDeniedError",
        "NotFoundError",
        "ConflictError",
        "UnsupportedMediaTypeError",
        "UnprocessableEntityError",
        "RateLimitError",
        "InternalServerError",
    }
)


@dataclass(frozen=True, slots=True)
class TransportMetrics:
    """The labelled children one transport's streams record into, looked up once:
    ``labels()`` takes a lock and builds a key on every call, and streams call it per
    frame."""

    streams_active: Any
    tokens_delivered: Any
    frames_written: Any
    ttft: Any
    reasoning_ttft: Any
    write_gap: Any
    resumes: Any
    events_replayed: Any
    slow_consumer_closes: Any


@functools.cache
def for_transport(transport: str) -> TransportMetrics:
    return TransportMetrics(
        streams_active=STREAMS_ACTIVE.labels(transport=transport),
        tokens_delivered=TOKENS_DELIVERED.labels(transport=transport),
        frames_written=FRAMES_WRITTEN.labels(transport=transport),
        ttft=STREAM_TTFT.labels(transport=transport),
        reasoning_ttft=STREAM_REASONING_TTFT.labels(transport=transport),
        write_gap=INTER_TOKEN_GAP.labels(transport=transport),
        resumes=RESUMES.labels(transport=transport),
        events_replayed=EVENTS_REPLAYED.labels(transport=transport),
        slow_consumer_closes=SLOW_CONSUMER_CLOSES.labels(transport=transport),
    )


def engine_error(error_type: str) -> None:
    ENGINE_ERRORS.labels(type=error_type if error_type in ENGINE_ERROR_TYPES else "other").inc()
