"""What a cut-off did to the shape of an answer.

A response truncated by ``max_tokens`` or a stall often ends inside a code block or in the
middle of a JSON document. The termination record stores both facts so the UI can say
"this code block is incomplete" and API clients know not to parse the JSON, without each of
them re-implementing Markdown fence rules.
"""

from __future__ import annotations

import json
import re

# CommonMark fence: up to 3 spaces of indent, then 3+ backticks or tildes. A tab counts as
# 4 columns, which makes the line indented code rather than a fence, so it is not matched.
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")
_JSON_INFO = re.compile(r"[ \t]*json[ \t]*", re.IGNORECASE)


def _lines(text: str) -> list[str]:
    # Markdown line endings only (\n, \r\n, \r); str.splitlines would also split on U+2028
    # and friends, which Markdown treats as ordinary characters.
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _closes(line: str, char: str, length: int) -> bool:
    match = _FENCE.fullmatch(line)
    return (
        match is not None
        and match[1][0] == char
        and len(match[1]) >= length
        and not match[2].strip(" \t")
    )


# Containers a fence can sit in: block quote markers, and a list item's marker, whose
# content column its later lines are indented to.
_QUOTES = re.compile(r"(?: {0,3}> ?)*")
_LIST_ITEM = re.compile(r" {0,3}(?:[-*+]|\d{1,9}[.)])(?: {1,4}|$)")


def has_unclosed_code_block(text: str) -> bool:
    """True when ``text`` ends inside a fenced code block (``` or ~~~), at the top level,
    in a block quote or in a list item (its lines indented to the item's content, as a
    numbered step's code block is): where a Markdown renderer shows a code block left
    open. Lazy continuation lines and nested lists deeper than one item are read as the
    item's own."""
    char, length = "", 0
    column = 0  # the content column of the list item the lines belong to (0: none)
    for raw in _lines(text):
        line = _QUOTES.sub("", raw, count=1)  # matches at the start, if only emptily
        if char:
            inner = line[column:] if line[:column].strip() == "" else line
            if _closes(inner, char, length):
                char = ""
            continue
        item = _LIST_ITEM.match(line)
        if item is not None:
            column = item.end()
            inner = line[column:]
        elif not line.strip():
            continue
        elif column and len(line) - len(line.lstrip(" ")) >= column:
            inner = line[column:]
        else:
            column = 0
            inner = line
        match = _FENCE.fullmatch(inner)
        if match is None:
            continue
        run, info = match[1], match[2]
        if run[0] == "`" and "`" in info:
            continue  # inline code such as ```x```, not a fence
        char, length = run[0], len(run)
    return bool(char)


def _fenced_json_body(stripped: str) -> str | None:
    """The content of ``stripped`` when it is one ```json block (closed or cut off)."""
    lines = _lines(stripped)
    match = _FENCE.fullmatch(lines[0])
    if match is None or not _JSON_INFO.fullmatch(match[2]):
        return None
    char, length = match[1][0], len(match[1])
    body = lines[1:]
    if len(body) >= 1 and _closes(body[-1], char, length):
        body = body[:-1]
    if any(_closes(line, char, length) for line in body):
        return None  # the block closes early and more text follows: not a single block
    return "\n".join(body)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _parses(text: str) -> bool:
    try:
        # NaN/Infinity are accepted by Python's json but by no other JSON parser.
        json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return False
    return True


def json_validity(text: str) -> bool | None:
    """None when ``text`` does not look like JSON; otherwise whether it parses.

    Looking like JSON means starting with ``{`` or ``[`` after stripping whitespace, or being
    a single ```json fenced block; an unclosed ```json block counts, and is invalid unless its
    content parses anyway.
    """
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        return _parses(stripped)
    if stripped.startswith(("```", "~~~")):
        body = _fenced_json_body(stripped)
        if body is not None:
            return _parses(body)
    return None
