"""Load and latency harness: real Daphne processes under many SSE and WebSocket streams,
with a bare FastAPI relay run in the same invocation as the baseline. See
docs/performance.md."""
