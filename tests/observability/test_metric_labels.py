"""Every metric label is a bounded set: a client cannot grow /metrics by inventing HTTP
methods (each made-up method used to be a new latency series, forever)."""

from __future__ import annotations

import httpx
import pytest

from tests.observability.scrape import Scrape, scrape

pytestmark = pytest.mark.asyncio

KNOWN = {"GET", "HEAD", "POST", "PUT", "DELETE", "TRACE", "OPTIONS", "CONNECT", "PATCH"}


def series(reading: Scrape) -> set:
    return set(reading.samples)


async def test_made_up_methods_share_one_label_value(daphne):
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:

        async def invent(names: range) -> None:
            for i in names:
                await client.request(f"X{i}METHOD", "/api/conversations/")
                await client.request(f"Y{i}", "/nowhere")

        await invent(range(3))
        await scrape(client)  # the scrapes' own series exist from here on
        first = await scrape(client)
        await invent(range(3, 40))
        then = await scrape(client)
    methods = {dict(labels).get("method") for _, labels in then.samples} - {None}
    assert methods <= KNOWN | {"<invalid method>"}, methods - KNOWN
    assert "<invalid method>" in methods
    # 74 more made-up methods and paths made no new series.
    assert series(then) == series(first)
