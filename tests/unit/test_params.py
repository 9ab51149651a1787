"""Generation params: every bad value names its field."""

from __future__ import annotations

import pytest

from streaming.params import ParamError, validate_params


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"max_tokens": 0}, "params.max_tokens"),
        ({"max_tokens": 10**9}, "params.max_tokens"),
        ({"max_tokens": "5"}, "params.max_tokens"),
        ({"max_tokens": True}, "params.max_tokens"),
        ({"temperature": 3}, "params.temperature"),
        ({"top_p": -0.1}, "params.top_p"),
        ({"stop": [""]}, "params.stop"),
        ({"stop": ["x"] * 50}, "params.stop"),
        ({"stop": 5}, "params.stop"),
        ({"seed": 1.5}, "params.seed"),
        ({"seed": 2**63}, "params.seed"),  # vLLM takes an int64
        ({"tools": {"type": "function"}}, "params.tools"),
        ({"tools": [{"type": "retrieval"}]}, "params.tools[0].type"),
        (
            {"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
            "params.tools[0].function.name",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "params.tools[0].function.parameters",
        ),
        ({"tool_choice": "always"}, "params.tool_choice"),
        ({"tool_choice": "required"}, "params.tool_choice"),  # no tools to require
        ({"tool_choice": "auto"}, "params.tool_choice"),  # nor to choose from
        ({"tools": [], "tool_choice": "auto"}, "params.tool_choice"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "unknown"}}},
            "params.tool_choice",
        ),
        # A name that is no string cannot be looked up among the tools' (unhashable ones
        # were a 500).
        (
            {"tool_choice": {"type": "function", "function": {"name": ["a"]}}},
            "params.tool_choice",
        ),
        ({"tool_choice": {"type": "function", "function": {"name": {}}}}, "params.tool_choice"),
        ({"bogus": 1}, "params.bogus"),
        ({"simulation": {"nope": 1}}, "params.simulation.nope"),
        ({"simulation": []}, "params.simulation"),
        ([], "params"),
    ],
)
def test_invalid_params_name_the_field(raw, field):
    with pytest.raises(ParamError) as info:
        validate_params(raw, accepts_simulation=True)
    assert info.value.field == field


def test_simulation_only_with_the_simulated_engine():
    with pytest.raises(ParamError) as info:
        validate_params({"simulation": {"length": 3}}, accepts_simulation=False)
    assert "simulated engine" in info.value.message


def test_valid_params_are_cleaned():
    clean = validate_params(
        {"max_tokens": 5, "temperature": 0.5, "stop": "END", "simulation": {"length": 3}},
        accepts_simulation=True,
    )
    assert clean["stop"] == ["END"]
    assert clean["max_tokens"] == 5
    assert clean["simulation"]["length"] == 3


def test_tools_and_tool_choice_pass_as_openai_wrote_them():
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    named = {"type": "function", "function": {"name": "get_weather"}}
    clean = validate_params({"tools": [tool], "tool_choice": named}, accepts_simulation=False)
    assert clean == {"tools": [tool], "tool_choice": named}
    auto = validate_params({"tools": [tool], "tool_choice": "auto"}, accepts_simulation=False)
    assert auto["tool_choice"] == "auto"
    required = validate_params(
        {"tools": [tool], "tool_choice": "required"}, accepts_simulation=False
    )
    assert required["tool_choice"] == "required"
    # "none" needs no tools: nothing is chosen.
    assert validate_params({"tool_choice": "none"}, accepts_simulation=False) == {
        "tool_choice": "none"
    }
