"""The one rule that makes text storable: NUL and unpaired surrogates become U+FFFD."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streaming.storable import REPLACEMENT, is_storable, storable


def test_nul_and_lone_surrogates_are_replaced_and_the_rest_kept():
    assert storable("a\x00b") == f"a{REPLACEMENT}b"
    assert storable("x\ud800y\udfffz") == f"x{REPLACEMENT}y{REPLACEMENT}z"
    text = "Family 👨‍👩‍👧‍👦, 日本語, é"
    assert storable(text) is text  # nothing to do: the same object, no copy
    assert is_storable(text) and not is_storable("\x00") and not is_storable("\udc80")


@given(st.text(alphabet=st.characters(codec=None)))
def test_the_result_always_encodes_and_keeps_its_length(text: str):
    clean = storable(text)
    assert is_storable(clean)
    assert len(clean) == len(text)
    clean.encode("utf-8")  # would raise for a lone surrogate
    assert "\x00" not in clean
