from __future__ import annotations

import pytest

from streaming.shape import has_unclosed_code_block, json_validity


@pytest.mark.parametrize(
    ("text", "unclosed"),
    [
        ("plain text", False),
        ("```python\nprint(1)\n```", False),
        ("```python\nprint(1)\n", True),
        ("intro\n```\ncode", True),
        ("~~~\ncode\n~~~", False),
        ("~~~\ncode\n```", True),  # the closing fence must use the same character
        ("````\n```\nstill code", True),  # ...and be at least as long
        ("````\ncode\n`````", False),
        ("   ```\nindented up to three spaces\n   ```", False),
        ("    ```\nfour spaces is indented code, not a fence", False),
        ("```\ncode\n``` not a close\n", True),  # a closing fence carries no info string
        ("``` inline ``` code", False),  # backticks in the info string: not a fence
        ("~~~ info with ``` is fine\ncode", True),
        ("``\nnot a fence", False),
        ("```a\n```\n```b\nsecond block open", True),
        ("```\r\ncode\r\n```\r\n", False),
        ("", False),
        # In a block quote, or in a list item (the item's content column, however deep).
        ("> ```python\n> print(1)", True),
        ("> ```python\n> print(1)\n> ```\nafter", False),
        ("> > ~~~\n> > nested quote", True),
        ("10. Install it:\n\n    ```bash\n    pip install x", True),
        ("10. Install it:\n\n    ```bash\n    pip install x\n    ```\n11. Done", False),
        ("- ```js\n  let a = 1;", True),
        ("1. Step\n   ```\n   code\n   ```", False),
        ("1. Step\n\nback at the top\n    ```\nindented code again", False),
    ],
)
def test_has_unclosed_code_block(text: str, unclosed: bool) -> None:
    assert has_unclosed_code_block(text) is unclosed


@pytest.mark.parametrize(
    ("text", "validity"),
    [
        ("Just prose.", None),
        ("", None),
        ('  {"a": 1}\n', True),
        ("[1, 2, 3]", True),
        ('{"a": [1, 2', False),  # cut off mid-document
        ('{"a": 1} and then prose', False),
        ("[NaN]", False),  # Python's json accepts it; JSON does not
        ('"a string"', None),  # does not look like a JSON document
        ('```json\n{"a": 1}\n```', True),
        ("```JSON\n[1]\n```\n", True),
        ('~~~json\n{"a": 1}\n~~~', True),
        ('```json\n{"a": 1', False),  # unclosed fence, truncated JSON
        ('```json\n{"a": 1}\n```\nMore text\n```', None),  # not a single block
        ('```python\n{"a": 1}\n```', None),
        ('Here it is:\n```json\n{"a": 1}\n```', None),
    ],
)
def test_json_validity(text: str, validity: bool | None) -> None:
    assert json_validity(text) is validity
