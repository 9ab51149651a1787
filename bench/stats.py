"""Distribution figures for the report."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(values: Sequence[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    return {
        "n": len(ordered),
        "p50": ordered[max(1, math.ceil(0.5 * len(ordered))) - 1],
        "p99": ordered[max(1, math.ceil(0.99 * len(ordered))) - 1],
        "max": ordered[-1],
    }
