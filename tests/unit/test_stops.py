from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from streaming.stops import StopFilter


def run(stops: list[str], parts: list[str]) -> tuple[list[str], str | None, str]:
    """Feed ``parts`` until a match; return what was shown per feed, the match, the tail."""
    stop_filter = StopFilter(stops)
    shown = []
    for part in parts:
        out, matched = stop_filter.feed(part)
        shown.append(out)
        if matched is not None:
            return shown, matched, stop_filter.flush()
    tail = stop_filter.flush()
    return shown, stop_filter.matched, tail


def expected_cut(text: str, stops: list[str]) -> tuple[str, str | None]:
    hits = [(text.find(s), -len(s), s) for s in stops if s and s in text]
    if not hits:
        return text, None
    at, _, stop = min(hits)
    return text[:at], stop


def test_stop_spanning_three_tokens_is_never_shown() -> None:
    shown, matched, tail = run(["END"], ["Hello E", "N", "D and more"])
    assert shown == ["Hello ", "", ""]
    assert matched == "END"
    assert tail == ""


def test_partial_match_at_end_is_flushed() -> None:
    shown, matched, tail = run(["END"], ["the E", "N"])
    assert shown == ["the ", ""]
    assert matched is None
    assert tail == "EN"


def test_failed_partial_match_is_released_on_the_next_feed() -> None:
    stop_filter = StopFilter(["END"])
    assert stop_filter.feed("WE") == ("W", None)
    assert stop_filter.feed("ST") == ("EST", None)


def test_shared_prefixes() -> None:
    stops = ["<|end|>", "<|eot|>"]
    shown, matched, _ = run(stops, ["x<|e", "o", "t|>y"])
    assert (shown, matched) == (["x", "", ""], "<|eot|>")

    shown, matched, tail = run(stops, ["x<|e", "n", "x"])
    assert ("".join(shown) + tail, matched) == ("x<|enx", None)


def test_stop_that_extends_another() -> None:
    assert run(["END", "ENDING"], ["xEND", "ING"])[1] == "ENDING"
    assert run(["END", "ENDING"], ["xEND", " y"])[1] == "END"


def test_tie_at_same_position_reports_the_longest() -> None:
    shown, matched, _ = run(["ab", "abc"], ["xa", "b", "c"])
    assert "".join(shown) == "x"
    assert matched == "abc"


def test_complete_match_inside_a_longer_candidate_is_resolved_at_flush() -> None:
    stop_filter = StopFilter(["ab", "abc"])
    assert stop_filter.feed("xab") == ("x", None)  # "abc" may still come
    assert stop_filter.flush() == ""
    assert stop_filter.matched == "ab"


def test_earliest_match_wins_over_the_one_completed_first() -> None:
    shown, matched, _ = run(["abcd", "bc"], ["ab", "c", "d"])
    assert "".join(shown) == ""
    assert matched == "abcd"


def test_finished_filter_returns_nothing() -> None:
    stop_filter = StopFilter(["STOP"])
    assert stop_filter.feed("done STOP after") == ("done ", "STOP")
    assert stop_filter.feed("more") == ("", None)
    assert stop_filter.flush() == ""


def test_empty_stop_strings_are_ignored() -> None:
    stop_filter = StopFilter(["", ""])
    assert stop_filter.feed("anything") == ("anything", None)
    assert stop_filter.flush() == ""


def test_hold_back_is_bounded_by_the_longest_stop() -> None:
    stop_filter = StopFilter(["xxxxy"])
    assert stop_filter.feed("x" * 10) == ("x" * 6, None)


@given(
    text=st.text(alphabet="abcE ND", max_size=40),
    stops=st.lists(st.text(alphabet="abcEND", max_size=4), max_size=4),
    data=st.data(),
)
def test_output_is_text_cut_at_first_stop_regardless_of_split(
    text: str, stops: list[str], data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)))))
    bounds = [0, *cuts, len(text)]
    parts = [text[a:b] for a, b in pairwise(bounds)]
    shown, matched, tail = run(stops, parts)
    assert ("".join(shown) + tail, matched) == expected_cut(text, stops)
