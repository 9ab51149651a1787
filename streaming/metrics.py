"""Stream metrics: what users feel, which HTTP middleware cannot see.

Channels consumers bypass Django middleware, so django-prometheus never sees a stream;
these are ours. Labels are bounded sets (transport, status, error type) - never ids.
With several processes set ``PROMETHEUS_MULTIPROC_DIR`` before start-up; gauges then sum
over live processes (``livesum``). docs/metrics.md lists every name.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Seconds; dense below one second where TTFT and gaps live.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0,
    5.0, 10.0, 30.0,
)  # fmt: skip

STREAM_TTFT = Histogram(
    "chat_stream_ttft_seconds",
    "Time to first token as the client sees it: stream accepted -> first delta written.",
    ["transport"],
    buckets=LATENCY_BUCKETS,
)
ENGINE_TTFT = Histogram(
    "chat_engine_ttft_seconds",
    "Time to first token as the engine gives it: generation start -> first engine token.",
    buckets=LATENCY_BUCKETS,
)
INTER_TOKEN_GAP = Histogram(
    "chat_stream_write_gap_seconds",
    "Gap between consecutive delta writes to one client.",
    ["transport"],
    buckets=LATENCY_BUCKETS,
)
TOKENS_DELIVERED = Counter(
    "chat_stream_delta_events_delivered_total",
    "Delta events written to clients (one event is one engine chunk).",
    ["transport"],
)
FRAMES_WRITTEN = Counter(
    "chat_stream_frames_written_total", "Frames written to clients (merged).", ["transport"]
)
STREAM_ENDS = Counter(
    "chat_stream_ends_total",
    "Client streams that ended, by how their segment ended (or 'disconnected'/'slow').",
    ["transport", "status"],
)
STREAMS_ACTIVE = Gauge(
    "chat_streams_active",
    "Open client streams.",
    ["transport"],
    multiprocess_mode="livesum",
)
ACTIVE_GENERATIONS = Gauge(
    "chat_generations_active", "Generations running.", multiprocess_mode="livesum"
)
STREAM_GENERATIONS_ENDED = Counter(
    "chat_generations_ended_total", "Generation segments ended, by status.", ["status"]
)
RESUMES = Counter(
    "chat_stream_resumes_total", "Streams opened with a cursor (resume).", ["transport"]
)
EVENTS_REPLAYED = Counter(
    "chat_stream_events_replayed_total",
    "Events sent from the backlog to resuming clients.",
    ["transport"],
)
CANCELS = Counter("chat_cancels_total", "Stop requests that ended a running generation.")
ABANDONS = Counter("chat_abandons_total", "Generations aborted because every reader left.")
ENGINE_ERRORS = Counter("chat_engine_errors_total", "Engine errors, by type.", ["type"])
SLOW_CONSUMER_CLOSES = Counter(
    "chat_slow_consumer_closes_total",
    "Connections closed because the client stopped reading.",
    ["transport"],
)
FLUSH_LATENCY = Histogram(
    "chat_persist_flush_seconds",
    "Write-behind flush of partial content, per batch.",
    buckets=LATENCY_BUCKETS,
)
REAPED = Counter("chat_reaped_segments_total", "Segments finalised by a reaper.")
