"""The baseline: a bare FastAPI relay in the seeds' reference shape.

``POST /stream`` answers a ``StreamingResponse`` of ``data: {"token": ...}`` lines and a
final ``data: {"done": true}``, straight from the engine: no database, no event log, no
resume, no metrics. It drives the same engines as the product (the simulated engine with
the same per-request ``simulation``, or a vLLM server when ``ENGINE_URL`` is set) and
detokenises the same way, so the difference in the figures is what the product does on
top. Each token carries the engine's emit stamp ``t`` like the product's bench mode.

Run: ``python -m bench.relay --fd N`` (the harness binds the socket) or ``--port N``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from streaming.detokenize import Detokenizer
from streaming.engines.base import ChatTurn, EngineRequest

app = FastAPI()
_ids = itertools.count()


def _engine() -> Any:
    url = os.environ.get("ENGINE_URL")
    if url:
        from streaming.engines.vllm import VLLMEngine

        return VLLMEngine(url, os.environ.get("ENGINE_MODEL", ""))
    from streaming.engines.simulated import SimulatedEngine

    return SimulatedEngine()


engine = _engine()


@app.post("/stream")
async def stream(request: Request) -> StreamingResponse:
    body = await request.json()
    request_id = f"relay-{os.getpid()}-{next(_ids)}"
    engine_request = EngineRequest(
        messages=[ChatTurn("user", body.get("content", ""))],
        request_id=request_id,
        model=getattr(engine, "model", ""),
        max_tokens=1024,
        simulation=dict(body.get("simulation") or {}) if engine.accepts_simulation else {},
    )

    async def tokens() -> AsyncIterator[str]:
        detok = Detokenizer()
        generated = 0  # the engine's tokens, told at the end (as our `done` tells them)
        try:
            async for chunk in engine.stream(engine_request):
                generated += chunk.tokens
                text = chunk.text if chunk.token_bytes is None else detok.feed(chunk.token_bytes)
                if text:
                    yield f"data: {json.dumps({'token': text, 't': chunk.emitted_at})}\n\n"
            tail = detok.flush()
            if tail:
                yield f"data: {json.dumps({'token': tail})}\n\n"
            yield f"data: {json.dumps({'done': True, 'tokens': generated})}\n\n"
        except Exception as exc:
            yield f"data: {json.dumps({'error': str(exc)})}\n\n"

    return StreamingResponse(
        tokens(), media_type="text/event-stream", headers={"X-Request-Id": request_id}
    )


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int)
    parser.add_argument("--port", type=int, default=8100)
    args = parser.parse_args()
    # Idle keep-alive connections are kept longer than a closed-loop user thinks (Daphne
    # keeps them for hours), so both sides serve a user's answers over one connection.
    options: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        "lifespan": "off",
        "timeout_keep_alive": 30,
    }
    if args.fd is not None:
        uvicorn.run(app, fd=args.fd, **options)
    else:
        uvicorn.run(app, host="127.0.0.1", port=args.port, **options)


if __name__ == "__main__":
    main()
