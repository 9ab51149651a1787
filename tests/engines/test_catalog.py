"""The catalog: which engine answers which model (a simulated engine and a vLLM client
against the emulator, over real sockets)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streaming.engines.catalog import Catalog
from streaming.engines.simulated import SimulatedEngine
from streaming.engines.vllm import VLLMEngine
from tests.emulator.server import run_emulator


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    with run_emulator(model="listed-model") as base_url:
        yield base_url


async def test_configured_and_listed_models_find_their_engines(emulator: str) -> None:
    simulated = SimulatedEngine()
    named = VLLMEngine(emulator, "listed-model")
    unnamed = VLLMEngine(emulator)
    catalog = Catalog({"default": simulated, "named": named})
    listing = Catalog({"default": unnamed, "sim": simulated})
    try:
        assert catalog.engine_for("listed-model") is named
        assert catalog.engine_for("simulated") is simulated
        assert catalog.engine_for("") is simulated
        assert (catalog.known("listed-model"), catalog.known("other")) == (True, False)
        served = [(s.info.id, s.engine) for s in await catalog.served()]
        assert served == [("simulated", simulated), ("listed-model", named)]
        assert served and (await catalog.served())[1].info.max_model_len == 4096

        # An engine without a model serves what its server lists, once it was asked.
        assert listing.known("listed-model") is None
        assert [s.info.id for s in await listing.served()] == ["listed-model", "simulated"]
        assert listing.known("listed-model") is True
        assert listing.engine_for("listed-model") is unnamed
    finally:
        await named.aclose()
        await unnamed.aclose()


async def test_an_unreachable_server_keeps_its_configured_model() -> None:
    down = VLLMEngine("http://127.0.0.1:9", "far-model", connect_timeout=0.5)
    catalog = Catalog({"default": SimulatedEngine(), "far": down})
    try:
        assert [s.info.id for s in await catalog.served()] == ["simulated", "far-model"]
    finally:
        await down.aclose()


def test_a_default_engine_is_required() -> None:
    with pytest.raises(ValueError, match="default"):
        Catalog({"other": SimulatedEngine()})
