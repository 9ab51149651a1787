"""A serving process's collector: start-up objects frozen, young collections spaced."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from chatsite import collector


@pytest.fixture
def restored() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_tune_freezes_what_is_alive_and_spaces_young_collections(restored: None) -> None:
    gc.unfreeze()
    alive = [[] for _ in range(3)]  # lists are tracked by the collector
    collector.tune(5_000)
    assert gc.get_threshold() == (5_000, collector.OLDER, collector.OLDER)
    assert gc.get_freeze_count() > len(alive)


def test_garbage_of_before_is_collected_not_frozen(restored: None) -> None:
    gc.unfreeze()

    class Cycle:
        pass

    a, b = Cycle(), Cycle()
    a.other, b.other = b, a  # type: ignore[attr-defined]
    gone = weakref.ref(a)
    del a, b
    collector.tune(5_000)
    assert gone() is None  # frozen, the cycle would have lived as long as the process


def test_zero_keeps_pythons_own_settings(restored: None) -> None:
    gc.unfreeze()
    before = gc.get_threshold()
    collector.tune(0)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
