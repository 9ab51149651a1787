"""Generation parameters a client may set, validated the same way for every entry point."""

from __future__ import annotations

from typing import Any

from django.conf import settings


class ParamError(ValueError):
    """A bad parameter; ``field`` names it (dotted for nested keys) for the 400 answer."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


ALLOWED = ("max_tokens", "temperature", "top_p", "stop", "seed", "simulation")


def _number(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ParamError(name, "must be a number")
    if not low <= value <= high:
        raise ParamError(name, f"must be between {low} and {high}")
    return float(value)


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
    if raw.get("max_tokens") is not None:
        value = raw["max_tokens"]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamError("params.max_tokens", "must be an integer")
        if not 1 <= value <= settings.MAX_TOKENS_CAP:
            raise ParamError(
                "params.max_tokens", f"must be between 1 and {settings.MAX_TOKENS_CAP}"
            )
        clean["max_tokens"] = value
    if raw.get("temperature") is not None:
        clean["temperature"] = _number("params.temperature", raw["temperature"], 0.0, 2.0)
    if raw.get("top_p") is not None:
        clean["top_p"] = _number("params.top_p", raw["top_p"], 0.0, 1.0)
    if raw.get("seed") is not None:
        seed = raw["seed"]
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ParamError("params.seed", "must be an integer")
        clean["seed"] = seed
    if raw.get("stop") is not None:
        stop = raw["stop"]
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise ParamError("params.stop", "must be a non-empty string or a list of them")
        if len(stop) > settings.MAX_STOP_SEQUENCES:
            raise ParamError("params.stop", f"at most {settings.MAX_STOP_SEQUENCES} sequences")
        if any(len(s) > 200 for s in stop):
            raise ParamError("params.stop", "each stop sequence is at most 200 characters")
        clean["stop"] = stop
    if raw.get("simulation") is not None:
        if not accepts_simulation:
            raise ParamError(
                "params.simulation", "is only accepted while the simulated engine is active"
            )
        from streaming.engines.simulated import validate_simulation

        try:
            clean["simulation"] = validate_simulation(raw["simulation"])
        except ValueError as exc:
            raise ParamError("params.simulation", str(exc)) from exc
    return clean
