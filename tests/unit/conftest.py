"""What several unit tests watch: the calls that go to a database thread."""

from __future__ import annotations

from typing import Any

import pytest

from streaming import database


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the functions sent to a database thread (``database.run``), in order;
    each still runs."""
    made: list[str] = []
    run = database.run

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        made.append(fn.__name__)
        return await run(fn, *args, **kwargs)

    monkeypatch.setattr(database, "run", counted)
    return made
