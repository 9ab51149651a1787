"""Generation parameters a client may set: one schema, for validation and for the docs.

``NUMBERS`` and the ``stop`` bounds below are the only statement of the rules:
``validate_params`` (every entry point: REST, WebSocket, the OpenAI endpoint) applies them,
and ``streaming.api.serializers`` builds the OpenAPI description of ``params`` from them,
so the documented bounds are the enforced ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from streaming.storable import UNSTORABLE, is_storable


class ParamError(ValueError):
    """A bad parameter; ``field`` names it (dotted for nested keys) for the 400 answer."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Number:
    """A numeric parameter; ``high`` may name a Django setting (read when validating)."""

    integer: bool
    low: float | None = None
    high: float | str | None = None

    def bounds(self) -> tuple[float | None, float | None]:
        high = getattr(settings, self.high) if isinstance(self.high, str) else self.high
        return self.low, high


NUMBERS: dict[str, Number] = {
    "max_tokens": Number(integer=True, low=1, high="MAX_TOKENS_CAP"),
    "temperature": Number(integer=False, low=0, high=2),
    "top_p": Number(integer=False, low=0, high=1),
    # An int64, as vLLM (and PyTorch's generators) take it.
    "seed": Number(integer=True, low=-(2**63), high=2**63 - 1),
}
# ``stop``: a string or a list of at most MAX_STOP_SEQUENCES strings of 1..MAX_STOP_CHARS.
MAX_STOP_CHARS = 200
ALLOWED = ("max_tokens", "temperature", "top_p", "stop", "seed", "simulation")


def max_stop_sequences() -> int:
    count: int = settings.MAX_STOP_SEQUENCES
    return count


def _number(name: str, spec: Number, value: Any) -> int | float:
    field = f"params.{name}"
    if spec.integer:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamError(field, "must be an integer")
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise ParamError(field, "must be a number")
    low, high = spec.bounds()
    if (low is not None and value < low) or (high is not None and value > high):
        raise ParamError(field, f"must be between {_shown(low)} and {_shown(high)}")
    return value if spec.integer else float(value)


def _shown(bound: float | None) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def _stop(raw: Any) -> list[str]:
    stop = [raw] if isinstance(raw, str) else raw
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise ParamError("params.stop", "must be a non-empty string or a list of them")
    if len(stop) > max_stop_sequences():
        raise ParamError("params.stop", f"at most {max_stop_sequences()} sequences")
    if not all(is_storable(s) for s in stop):
        raise ParamError("params.stop", UNSTORABLE)
    if any(len(s) > MAX_STOP_CHARS for s in stop):
        raise ParamError(
            "params.stop", f"each stop sequence is at most {MAX_STOP_CHARS} characters"
        )
    return stop


def validate_params(raw: Any, *, accepts_simulation: bool) -> dict[str, Any]:
    """Return the cleaned params or raise ``ParamError`` naming the offending field."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ParamError("params", "must be an object")
    unknown = sorted(set(raw) - set(ALLOWED))
    if unknown:
        raise ParamError(f"params.{unknown[0]}", "is not a known parameter")
    clean: dict[str, Any] = {}
    for name, spec in NUMBERS.items():
        if raw.get(name) is not None:
            clean[name] = _number(name, spec, raw[name])
    if raw.get("stop") is not None:
        clean["stop"] = _stop(raw["stop"])
    if raw.get("simulation") is not None:
        if not accepts_simulation:
            raise ParamError(
                "params.simulation", "is only accepted while the simulated engine is active"
            )
        from streaming.engines.simulated import SimulationError, validate_simulation

        try:
            clean["simulation"] = validate_simulation(raw["simulation"])
        except SimulationError as exc:
            field = f"params.simulation.{exc.key}" if exc.key else "params.simulation"
            raise ParamError(field, exc.message) from exc
    return {name: clean[name] for name in ALLOWED if name in clean}
