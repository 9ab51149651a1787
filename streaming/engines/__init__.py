"""Engines, chosen by ``STREAMING["ENGINES"]`` the way ``CACHES`` chooses caches:
``{"default": {"BACKEND": "streaming.engines.vllm.VLLMEngine", "LOCATION": url, ...},
"big": {..., "MODEL": "big-model"}}``. Each serves its ``MODEL`` (or what its server
lists); the ``default`` engine answers requests that name no model (``catalog``)."""

from __future__ import annotations

from streaming.conf import build_backend, streaming_settings
from streaming.engines.base import Engine


def build_engines() -> dict[str, Engine]:
    engines: dict[str, Engine] = {}
    for name, config in streaming_settings.ENGINES.items():
        engines[name] = build_backend(config)
    if "default" not in engines:
        raise ValueError('STREAMING["ENGINES"] needs a "default" engine')
    return engines
