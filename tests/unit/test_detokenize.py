from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from streaming.detokenize import ZWJ, Detokenizer

FAMILY = "👨\u200d👩\u200d👧\u200d👦"
FLAGS = "🇯🇵🇮🇳🇧🇷"
WAVE_MEDIUM = "👋🏽"
HINDI = "क्षत्रिय द्वितीय प्रश्न"  # conjuncts: virama and vowel signs are combining marks


def run(tokens: list[bytes]) -> tuple[list[str], str]:
    detok = Detokenizer()
    return [detok.feed(token) for token in tokens], detok.flush()


def split_every(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def is_regional_indicator(char: str) -> bool:
    return 0x1F1E6 <= ord(char) <= 0x1F1FF


@st.composite
def text_and_split(draw: st.DrawFn) -> tuple[str, list[bytes]]:
    # U+FFFD is left out so that any U+FFFD in the output is one the detokenizer made up.
    text = draw(st.text(st.characters(codec="utf-8", exclude_characters="\ufffd")))
    data = text.encode()
    cuts = sorted(draw(st.sets(st.integers(0, len(data)))))
    bounds = [0, *cuts, len(data)]
    return text, [data[a:b] for a, b in pairwise(bounds)]


@given(text_and_split())
def test_any_split_reassembles_exactly_without_replacement_characters(
    case: tuple[str, list[bytes]],
) -> None:
    text, tokens = case
    outputs, tail = run(tokens)
    assert "".join(outputs) + tail == text
    for out in outputs:
        assert "\ufffd" not in out
        assert not out.endswith(ZWJ)


@given(st.lists(st.sampled_from([FAMILY, FLAGS, WAVE_MEDIUM, "x", " ", "❤\ufe0f"]), min_size=1))
def test_emoji_deltas_never_end_on_a_joiner_or_half_a_flag(parts: list[str]) -> None:
    outputs, _ = run(split_every("".join(parts).encode(), 1))
    shown = ""
    for out in outputs:
        shown += out
        run_length = len(shown) - len(shown.rstrip("".join(map(chr, range(0x1F1E6, 0x1F200)))))
        assert not shown.endswith(ZWJ)
        assert run_length % 2 == 0


def test_japanese_split_inside_characters() -> None:
    text = "こんにちは、世界。日本語のテキストです。"
    outputs, tail = run(split_every(text.encode(), 2))
    assert "".join(outputs) + tail == text
    assert tail == ""
    assert all("\ufffd" not in out for out in outputs)
    assert outputs[0] == ""  # two bytes of a three-byte character: nothing to show yet


def test_family_split_inside_the_zwj_sequence() -> None:
    outputs, tail = run(split_every(f"{FAMILY} ok".encode(), 3))
    assert "".join(outputs) + tail == f"{FAMILY} ok"
    shown = [out for out in outputs if out]
    assert all(not out.endswith(ZWJ) for out in shown)
    assert all(not out.startswith(ZWJ) or len(out) > 1 for out in shown)


def test_flag_is_released_only_as_a_pair() -> None:
    detok = Detokenizer()
    japan = "🇯🇵".encode()
    assert detok.feed(japan[:4]) == ""  # first regional indicator, complete but unpaired
    assert detok.feed(japan[4:6]) == ""
    assert detok.feed(japan[6:]) == "🇯🇵"
    assert detok.feed("🇺".encode()) == ""
    assert detok.flush() == "🇺"  # an unpaired indicator at the end is still released


def test_skin_tone_arrives_with_its_base() -> None:
    detok = Detokenizer()
    assert detok.feed("👋".encode()) == ""
    assert detok.feed("🏽".encode()) == WAVE_MEDIUM
    assert detok.feed("👋".encode()) == ""
    assert detok.feed(b" ") == "👋 "  # no modifier came: released with the next character


def test_held_emoji_is_released_by_flush() -> None:
    detok = Detokenizer()
    assert detok.feed("🎉".encode()) == ""
    assert detok.flush() == "🎉"


def test_combining_marks_survive_any_split() -> None:
    data = HINDI.encode()
    for size in (1, 2, 4):
        outputs, tail = run(split_every(data, size))
        assert "".join(outputs) + tail == HINDI


def test_invalid_byte_becomes_one_replacement_at_once() -> None:
    detok = Detokenizer()
    assert detok.feed(b"ok\xff") == "ok\ufffd"


def test_truncated_sequence_becomes_replacement_when_known_invalid() -> None:
    detok = Detokenizer()
    assert detok.feed(b"\xe3\x81") == ""  # could still become a character
    assert detok.feed(b"A") == "\ufffdA"


def test_a_character_cut_by_the_end_of_generation_is_not_output() -> None:
    detok = Detokenizer()
    assert detok.feed("こ".encode() + "ん".encode()[:2]) == "こ"
    assert detok.flush() == "", "no U+FFFD of ours: the text ends with the last whole character"
    assert detok.feed("é".encode()) == "é", "the decoder starts clean after a flush"
