"""Generation parameters a client may set: one schema, for validation and for the docs.

``NUMBERS`` and the ``stop`` bounds below are the only statement of the rules:
``validate_params`` (every entry point: REST, WebSocket, the OpenAI endpoint) applies them,
and ``streaming.api.serializers`` builds the OpenAPI description of ``params`` from them,
so the documented bounds are the enforced ones.
"""

from __future__ import annotations

import re
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
# ``tools``: OpenAI's function tools, at most MAX_TOOLS; ``tool_choice`` as OpenAI's.
MAX_TOOLS = 128
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
TOOL_CHOICES = ("none", "auto", "required")
ALLOWED = (
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "tools",
    "tool_choice",
    "simulation",
)


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


def _tools(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise ParamError("params.tools", f"must be a list of at most {MAX_TOOLS} tools")
    tools = []
    for i, tool in enumerate(raw):
        where = f"params.tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ParamError(f"{where}.type", 'must be "function"')
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ParamError(f"{where}.function", "must be an object")
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise ParamError(f"{where}.function.name", "must be 1-64 of A-Z a-z 0-9 _ . -")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise ParamError(f"{where}.function.description", "must be a string")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise ParamError(f"{where}.function.parameters", "must be a JSON Schema object")
        if not _storable_throughout(tool):
            raise ParamError(where, UNSTORABLE)
        tools.append(tool)
    return tools


def _storable_throughout(value: Any) -> bool:
    """Whether every string in a JSON value, keys included, is storable: PostgreSQL's
    ``jsonb`` refuses U+0000 anywhere (which ``json.dumps`` writes as an escape, so the
    text of a whole value cannot tell)."""
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, str):
            if not is_storable(current):
                return False
        elif isinstance(current, dict):
            stack.extend(current.keys())
            stack.extend(current.values())
        elif isinstance(current, list):
            stack.extend(current)
    return True


def _tool_choice(raw: Any, tools: list[dict[str, Any]]) -> Any:
    if raw != "none" and not tools:
        # As OpenAI and vLLM refuse it: a choice among no tools (passed on, vLLM would fail
        # the answer with a 400 of its own).
        raise ParamError("params.tool_choice", 'needs tools to choose from (but "none")')
    if isinstance(raw, str) and raw in TOOL_CHOICES:
        return raw
    names = {tool["function"]["name"] for tool in tools}
    function = raw.get("function") if isinstance(raw, dict) else None
    if (
        isinstance(raw, dict)
        and raw.get("type") == "function"
        and isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and function["name"] in names
    ):
        return {"type": "function", "function": {"name": function["name"]}}
    raise ParamError(
        "params.tool_choice",
        'must be "none", "auto", "required" or {"type": "function", "function": {"name": '
        "one of the tools}}",
    )


def unknown_field(key: str) -> str:
    """What a request is told of a key none of its fields takes (``key: ...``); a
    generation parameter beside the content, as OpenAI's API has it, is pointed to
    ``params``."""
    if key in ALLOWED:
        return f"is not a field here; generation parameters go in params (params.{key})"
    return "is not a known field"


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
    if raw.get("tools") is not None:
        clean["tools"] = _tools(raw["tools"])
    if raw.get("tool_choice") is not None:
        clean["tool_choice"] = _tool_choice(raw["tool_choice"], clean.get("tools", []))
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


def simulation_keys() -> tuple[
    dict[str, tuple[float, float]], dict[str, tuple[int, int]], tuple[str, ...]
]:
    """The simulated engine's ``simulation`` keys, for its OpenAPI description: numbers
    and integers with their (lowest, highest), and strings; besides them, ``tool_call``
    (``{"name", "arguments"}``)."""
    from streaming.engines import simulated

    return simulated.FLOAT_KEYS, simulated.INT_KEYS, simulated.TEXT_KEYS
