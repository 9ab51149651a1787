"""The readiness check of the database: probes that overlap share one check and its
answer, with the database really asked (each check is held at a gate before it asks)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import pytest

from streaming import health

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass
class Held:
    """Every database check waits for ``opened`` before its ``SELECT 1``; ``checks``
    counts the checks made."""

    opened: threading.Event = field(default_factory=threading.Event)
    checks: int = 0


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Held:
    gate = Held()
    select_one = health._select_one

    def held_select_one() -> None:
        gate.checks += 1
        gate.opened.wait()
        select_one()

    monkeypatch.setattr(health, "_select_one", held_select_one)
    return gate


async def test_a_probe_during_a_check_gets_that_checks_answer(held: Held) -> None:
    first = asyncio.ensure_future(health._check(health._database()))
    second = asyncio.ensure_future(health._check(health._database()))
    # Opened once both probes have started (callbacks run in the order they were made):
    # the second came while the first's check was running.
    asyncio.get_running_loop().call_soon(held.opened.set)
    assert await asyncio.gather(first, second) == [health.OK, health.OK]
    assert held.checks == 1
    # That check answered: the next probe asks the database again.
    assert await health._check(health._database()) == health.OK
    assert held.checks == 2
