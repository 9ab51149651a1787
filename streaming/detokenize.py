"""Incremental UTF-8 decoding of token byte strings.

Byte-level BPE engines emit tokens that are byte strings, not text: a Japanese character
(3 bytes) or an emoji (4 bytes) is regularly split across two or three tokens. Decoding each
token on its own would show U+FFFD where the split falls. `Detokenizer` keeps the incomplete
tail until the next token completes it, and shows U+FFFD only for bytes that can never become
a character (and drops the bytes of one the end of generation cut short).

On top of that it avoids ending a delta where the next character is very likely to change how
the last one renders: on a zero-width joiner, on the first half of a flag, or on an emoji that
a skin tone / variation selector may still modify. That hold-back is one short trailing unit
(a pictograph or flag half and any joiners before it), released with the next character that
arrives or by `flush`.
"""

from __future__ import annotations

import codecs

ZWJ = "\u200d"
_ZWJ_CP = 0x200D
_VS16_CP = 0xFE0F
_RI_FIRST, _RI_LAST = 0x1F1E6, 0x1F1FF  # regional indicators: two make a flag
_TONE_FIRST, _TONE_LAST = 0x1F3FB, 0x1F3FF  # skin-tone modifiers


def _is_regional_indicator(char: str) -> bool:
    return _RI_FIRST <= ord(char) <= _RI_LAST


def _may_be_modified(cp: int) -> bool:
    """Could a skin tone or VS16 still attach to this emoji?

    A range test rather than Unicode's Emoji_Modifier_Base table: the stdlib has no emoji
    properties, and holding a pictograph one character too long costs nothing visible.
    """
    return 0x1F300 <= cp <= 0x1FAFF or 0x2600 <= cp <= 0x27BF or 0x2300 <= cp <= 0x23FF


def _held_tail_start(text: str) -> int:
    """Index where the cosmetic hold-back of ``text`` starts (``len(text)`` for none)."""
    end = len(text)
    cp = ord(text[-1])
    if cp < _ZWJ_CP:  # ASCII, Latin, Arabic, Devanagari...: the common case, decided at once
        return end
    if cp == _VS16_CP or _TONE_FIRST <= cp <= _TONE_LAST:
        return end  # the modifier has arrived: nothing left to wait for but a joiner
    if _RI_FIRST <= cp <= _RI_LAST:
        # What was released so far ends on a whole number of flags (barring garbage such as
        # a joiner between indicators), so the run inside `text` decides the pairing.
        run = 1
        while run < end and _is_regional_indicator(text[end - 1 - run]):
            run += 1
        if run % 2 == 0:
            return end
    elif cp != _ZWJ_CP and not _may_be_modified(cp):
        return end
    # Hold the last character with any joiners before it: no delta ever ends on a joiner.
    cut = end - 1
    while cut and text[cut - 1] == ZWJ:
        cut -= 1
    return cut


class Detokenizer:
    """Turns a stream of token byte strings into a stream of complete text.

    One per generation; not thread-safe. `feed` costs one C-level decode call plus a look at
    the last character, because it runs for every token of every stream.
    """

    __slots__ = ("_decode", "_decoder", "_held")

    def __init__(self) -> None:
        # "replace" turns bytes into U+FFFD only once the codec knows they cannot start or
        # continue a character; an incomplete sequence stays buffered inside the decoder.
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._decode = self._decoder.decode
        self._held = ""

    def feed(self, token_bytes: bytes) -> str:
        """Return the text completed by this token; possibly empty."""
        text = self._decode(token_bytes)
        if not text:
            return ""
        if self._held:
            text = self._held + text
        cut = _held_tail_start(text)
        self._held = text[cut:]
        return text[:cut] if self._held else text

    def flush(self) -> str:
        """Return everything still held at the end of generation.

        The bytes of a character the end cut short (``max_tokens`` mid-character) are not
        output, as vLLM holds them back too: the text ends with the last whole character,
        and a Continue generates the cut one whole instead of after a U+FFFD.
        """
        text = self._held
        self._held = ""
        self._decoder.reset()
        return text
