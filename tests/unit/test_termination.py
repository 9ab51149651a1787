"""The termination record: ``as_dict`` is the whole record, as ``dataclasses.asdict``
gives it, for any values its fields take."""

from __future__ import annotations

from dataclasses import asdict

from hypothesis import given
from hypothesis import strategies as st

from streaming.termination import Status, Termination

maybe_int = st.none() | st.integers(min_value=0)
maybe_ms = st.none() | st.floats(min_value=0, allow_nan=False)
maybe_text = st.none() | st.text(max_size=20)


@given(
    st.builds(
        Termination,
        status=st.sampled_from([s.value for s in Status]),
        finish_reason=maybe_text,
        stop_reason=maybe_text | maybe_int,
        prompt_tokens=st.integers(min_value=0),
        completion_tokens=st.integers(min_value=0),
        reasoning_tokens=maybe_int,
        ttft_ms=maybe_ms,
        reasoning_ttft_ms=maybe_ms,
        duration_ms=maybe_ms,
        has_unclosed_code_block=st.booleans(),
        is_valid_json=st.none() | st.booleans(),
        error_type=maybe_text,
        error_message=maybe_text,
        error_code=maybe_text,
        context_full=st.booleans(),
        ended_in_reasoning=st.booleans(),
    )
)
def test_as_dict_is_the_whole_record(record: Termination) -> None:
    assert record.as_dict() == asdict(record)
    assert list(record.as_dict()) == list(asdict(record))


def test_as_dict_is_a_copy() -> None:
    record = Termination(status=Status.COMPLETE.value)
    copied = record.as_dict()
    copied["status"] = Status.ERROR.value
    assert record.status == Status.COMPLETE.value
