"""The one parser of what clients send: what it takes is what every encoder here can
write back (orjson: 64-bit integers, 254 levels; jsonb: no infinities)."""

from __future__ import annotations

import orjson
import pytest

from streaming.jsonbody import (
    HIGHEST_INT,
    LOWEST_INT,
    MAX_DEPTH,
    InvalidBody,
    InvalidJSON,
    decode_json,
    decode_json_body,
)


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("value", [LOWEST_INT, HIGHEST_INT, 0, 1.5, -1e300])
def test_numbers_in_range_are_taken_and_written_back(value: float) -> None:
    decoded = decode_json(f'{{"x": {value}}}')
    assert decoded == {"x": value}
    assert orjson.loads(orjson.dumps(decoded)) == decoded


@pytest.mark.parametrize("text", [str(LOWEST_INT - 1), str(HIGHEST_INT + 1), "1e400", "-1e400"])
def test_numbers_out_of_range_are_refused_naming_where(text: str) -> None:
    with pytest.raises(InvalidJSON, match=r"out of range at x\[1\]: ") as refused:
        decode_json(f'{{"x": [0, {text}]}}')
    assert refused.value.field == "x[1]"
    with pytest.raises(InvalidJSON, match="out of range: ") as alone:
        decode_json(text)
    assert alone.value.field is None


def test_the_first_number_out_of_range_is_named() -> None:
    text = '{"a": 1, "params": {"seed": 1e999, "n": [2e999]}, "z": 3e999}'
    with pytest.raises(InvalidJSON) as refused:
        decode_json(text)
    assert refused.value.field == "params.seed"


def test_nesting_up_to_the_bound_is_taken_and_deeper_is_refused() -> None:
    assert orjson.dumps({"wrapped": {"twice": decode_json(deep(MAX_DEPTH))}})
    for levels in (MAX_DEPTH + 1, 100_000):
        with pytest.raises(InvalidJSON, match="nested deeper"):
            decode_json(deep(levels))
    with pytest.raises(InvalidJSON, match="nested deeper"):
        decode_json('{"a": ' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1))


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "{", "[1,]"])
def test_what_is_not_json_is_refused(text: str) -> None:
    with pytest.raises(InvalidJSON, match="not valid JSON"):
        decode_json(text)


def test_a_body_says_what_is_wrong_with_it() -> None:
    with pytest.raises(InvalidBody, match=r"^the request body is not valid UTF-8"):
        decode_json_body(b'"\xff"')
    with pytest.raises(InvalidBody, match=r"^the request body has a number out of range") as big:
        decode_json_body(b"[1e999]")
    assert (big.value.field, big.value.detail) == ("[0]", "number 1e999 is too large")
    with pytest.raises(InvalidBody, match=r"^the request body is nested deeper than") as nested:
        decode_json_body(deep(MAX_DEPTH + 1).encode())
    # Without a field, the error object's message is the whole sentence, not a fragment.
    assert nested.value.field is None
    assert nested.value.detail.startswith("the request body is nested deeper than")
    with pytest.raises(InvalidBody) as broken:
        decode_json_body(b"{")
    assert broken.value.detail.startswith("the request body is not valid JSON")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"\\ud800": 1}', None),
        ('{"a": {"b\\u0000": 1}}', "a"),
        ('{"p": [1, {"x": {"\\udc00": 2}}]}', "p[1].x"),
    ],
)
def test_a_key_no_encoder_can_write_back_is_refused_naming_where(
    text: str, field: str | None
) -> None:
    """Keys are echoed in errors (an unknown one is named) and stored (a tool's schema):
    NUL and unpaired surrogates are refused at the door, as in any value."""
    with pytest.raises(InvalidJSON, match="has a key with a NUL character") as refused:
        decode_json(text)
    assert refused.value.field == field
