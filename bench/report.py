"""The stdout table: each figure of ours beside the baseline's, with the ratio."""

from __future__ import annotations

from typing import Any

# Figures shown in the table (everything is in the JSON); distributions show p50/p99/max.
SHOWN = (
    "users",
    "streams",
    "errors",
    "tokens",
    "tokens_per_second",
    "accept_ms",
    "ttft_ms",
    "ttft_added_ms",
    "gap_ms",
    "added_latency_ms",
    "frames_per_token",
    "cpu_seconds",
    "cpu_ms_per_answer",
    "cpu_seconds_per_1k_tokens",
    "machine_busy_percent",
    "machine_cpu_ms_per_answer",
    "postgres_cpu_ms_per_answer",
    "redis_cpu_ms_per_answer",
    "lost_streams",
    "duplicated_streams",
    "mismatched_streams",
    "missing_messages",
    "status_differs",
    "open_streams",
    "open_errors",
    "rss_idle_mib",
    "rss_per_open_stream_kib",
    "stopped_clients",
    "rss_per_stopped_client_kib",
    "not_aborted",
    "abort_latency_ms",
    "resume_sse_ms",
    "resume_sse_added_ms",
    "resume_ws_ms",
    "resume_ws_added_ms",
    "answer_bytes",
    "generate_seconds",
    "stopped_readers",
    "rss_per_stopped_reader_kib",
    "rss_left_after_close_mib",
    "full_readers",
    "full_readers_exact",
    "full_replay_seconds",
)


def _rows(figures: dict[str, Any]) -> dict[str, float | int | None]:
    rows: dict[str, float | int | None] = {}
    for key in SHOWN:
        if key not in figures:
            continue
        value = figures[key]
        if isinstance(value, dict):
            for part in ("p50", "p99", "max"):
                rows[f"{key} {part}"] = value.get(part)
        else:
            rows[key] = value
    return rows


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return f"{value:,}"


def table(scenarios: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'scenario':<8} {'figure':<34} {'ours':>14} {'baseline':>14} {'ratio':>8}"]
    lines.append("-" * len(lines[0]))
    for name, result in scenarios.items():
        ours = _rows(result.get("ours", {}))
        base = _rows(result.get("baseline", {}))
        for key, value in ours.items():
            other = base.get(key)
            ratio = "-"
            if isinstance(value, int | float) and isinstance(other, int | float) and other:
                ratio = f"{value / other:.2f}"
            lines.append(f"{name:<8} {key:<34} {_fmt(value):>14} {_fmt(other):>14} {ratio:>8}")
        for key in ("error_samples",):
            for side in ("ours", "baseline"):
                samples = result.get(side, {}).get(key)
                if samples:
                    lines.append(f"{name:<8} {side} errors: {'; '.join(samples)[:300]}")
    return "\n".join(lines)
