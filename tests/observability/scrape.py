"""Read a process's ``/metrics`` the way Prometheus does, and compare two readings."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

SampleKey = tuple[str, tuple[tuple[str, str], ...]]

POLL_INTERVAL = 0.05


@dataclass(frozen=True)
class Scrape:
    samples: dict[SampleKey, float]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        samples: dict[SampleKey, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                samples[key] = sample.value
        return cls(samples)

    def value(self, name: str, **labels: str) -> float:
        """The sample with exactly these labels; 0 when it does not exist yet."""
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """Sum over every sample of ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(v for (n, lbl), v in self.samples.items() if n == name and wanted <= set(lbl))

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}


async def scrape(client: httpx.AsyncClient) -> Scrape:
    response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return Scrape.parse(response.text)


async def scrape_until(
    client: httpx.AsyncClient, ready: Callable[[Scrape], bool], within: float = 10.0
) -> Scrape:
    """Scrape until ``ready`` holds: for what another process does after the client is done
    (no event reaches the test for it). Fails with the last reading's state on timeout."""
    deadline = time.monotonic() + within
    while True:
        reading = await scrape(client)
        if ready(reading):
            return reading
        if time.monotonic() > deadline:
            raise AssertionError(f"metrics never reached the expected state in {within} s")
        await asyncio.sleep(POLL_INTERVAL)
