"""Engines: ``ENGINE_URL`` set selects the vLLM (OpenAI-compatible) client, unset the
simulated engine, the way a setting picks a Django backend."""

from __future__ import annotations

from django.conf import settings

from streaming.engines.base import Engine


def build_engine() -> Engine:
    if settings.ENGINE_URL:
        from streaming.engines.vllm import VLLMEngine

        return VLLMEngine(
            settings.ENGINE_URL,
            settings.ENGINE_MODEL,
            api_key=settings.ENGINE_API_KEY,
            connect_timeout=settings.ENGINE_CONNECT_TIMEOUT,
            read_timeout=settings.STREAM_STALL_TIMEOUT,
        )
    from streaming.engines.simulated import SimulatedEngine

    return SimulatedEngine()
