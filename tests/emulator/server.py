"""Run the vLLM emulator for tests: a real uvicorn server on a free localhost port.

A real server (not an in-process ASGI transport) because what we test is socket behaviour:
keep-alive, a connection closed mid-stream reaching the server as an abort, stalls and drops.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn

from .vllm_emulator import DEFAULT_MAX_MODEL_LEN, DEFAULT_MODEL, create_app, quiet_intentional_drops

_POLL_INTERVAL = 0.01


@contextmanager
def run_emulator(
    *,
    model: str = DEFAULT_MODEL,
    api_key: str | None = None,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    startup_timeout: float = 10.0,
) -> Iterator[str]:
    """Serve an emulator in a background thread; yields its base URL (no ``/v1``).

    The listening socket is bound (port 0) and put in listen state *before* uvicorn starts,
    so the readiness probe's connection simply waits in the accept queue until the server
    serves it: no fixed sleeps and no retry loop.
    """
    quiet_intentional_drops()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    app = create_app(model=model, api_key=api_key, max_model_len=max_model_len)
    config = uvicorn.Config(
        app,
        loop="asyncio",
        http="h11",
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=5,  # vLLM's value
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    # An engine core that died takes the server down (die_after_tokens).
    app.state.emulator.on_exit = lambda: setattr(server, "should_exit", True)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"vllm-emulator-{port}", daemon=True
    )
    thread.start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        response = httpx.get(f"{base_url}/health", timeout=startup_timeout)
        response.raise_for_status()
        yield base_url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def _ended(record: dict[str, Any] | None) -> bool:
    return record is not None and record["outcome"] != "running"


def _timed_out(base_url: str, request_id: str, timeout: float, record: Any) -> TimeoutError:
    state = record["outcome"] if record else "never seen"
    return TimeoutError(f"request {request_id} at {base_url} still {state} after {timeout} s")


def wait_for_request_end(base_url: str, request_id: str, timeout: float = 5.0) -> dict[str, Any]:
    """Poll the emulator until the request has ended; returns its record.

    Polling is the honest tool here: the state lives in another thread or process.
    """
    deadline = time.monotonic() + timeout
    record = None
    with httpx.Client(base_url=base_url, timeout=timeout) as client:
        while True:
            response = client.get(f"/_emulator/requests/{request_id}")
            record = response.json() if response.status_code == 200 else None
            if _ended(record) or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_INTERVAL)
    if not _ended(record):
        raise _timed_out(base_url, request_id, timeout, record)
    assert record is not None
    return record


async def await_request_end(base_url: str, request_id: str) -> dict[str, Any]:
    """``wait_for_request_end`` for async tests; bound it with ``asyncio.timeout``."""
    async with httpx.AsyncClient(base_url=base_url, timeout=5.0) as client:
        while True:
            response = await client.get(f"/_emulator/requests/{request_id}")
            record = response.json() if response.status_code == 200 else None
            if record is not None and _ended(record):
                return record
            await asyncio.sleep(_POLL_INTERVAL)


def reset_emulator(base_url: str) -> None:
    """Forget recorded requests and restore health (between tests sharing one emulator)."""
    httpx.post(f"{base_url}/_emulator/reset", timeout=5.0).raise_for_status()
