"""The tiny model itself: built byte-identically, and saying exactly what is planted in it
through the real server and its reasoning and tool-call parsers. Every other ``vllm``
test builds on these answers."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.vllm import planted
from tests.vllm.conftest import VLLMServer, build_model, vllm_python

pytestmark = pytest.mark.vllm


def digests(directory: Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
    }


def test_the_model_builds_byte_identically(vllm_server: VLLMServer, tmp_path: Path) -> None:
    python = vllm_python()
    assert python is not None
    build_model(python, tmp_path)

    built = digests(tmp_path)
    files = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert set(built) == files
    assert built == digests(vllm_server.model_dir)


def stream(server: VLLMServer, **body: Any) -> list[dict[str, Any]]:
    """The chunks of one streamed completion, straight from vLLM."""
    payload = {"model": server.model, "stream": True, "stream_options": {"include_usage": True}}
    chunks = []
    with (
        httpx.Client(base_url=server.url, timeout=30) as client,
        client.stream("POST", "/v1/chat/completions", json={**payload, **body}) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[len("data: ") :]))
    return chunks


def joined(chunks: list[dict[str, Any]], field: str) -> str:
    return "".join(c["choices"][0]["delta"].get(field) or "" for c in chunks if c["choices"])


def test_the_planted_answers(vllm_server: VLLMServer) -> None:
    normal = stream(vllm_server, messages=[{"role": "user", "content": "Say hello"}])
    thinking = stream(
        vllm_server, messages=[{"role": "user", "content": f"Please {planted.PONDER} this"}]
    )

    assert joined(normal, "content") == planted.NORMAL
    assert joined(normal, "reasoning") == ""
    assert joined(thinking, "reasoning") == planted.REASONING
    assert joined(thinking, "content") == planted.REASONED_ANSWER
    assert thinking[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


def test_the_planted_tool_call(vllm_server: VLLMServer) -> None:
    chunks = stream(
        vllm_server,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[planted.WEATHER_TOOL],
    )

    calls = [
        call
        for c in chunks
        if c["choices"]
        for call in c["choices"][0]["delta"].get("tool_calls") or []
    ]
    assert calls[0]["function"]["name"] == planted.TOOL_NAME
    assert "".join(c["function"].get("arguments") or "" for c in calls) == planted.TOOL_ARGUMENTS
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
