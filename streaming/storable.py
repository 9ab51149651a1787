"""Text made storable once, at the boundaries where it enters: one rule for everything.

PostgreSQL's ``text`` and ``jsonb`` reject U+0000, and an unpaired surrogate (U+D800 to
U+DFFF alone) cannot be encoded as UTF-8 at all, so neither survives the database, the
Redis log or a JSON frame. Model output can contain both (a byte-level model can emit
``<0x00>``; an engine's error text is anyone's). The generation replaces each with U+FFFD
before the text becomes an event, so what readers saw, what the log holds and what the
database stores are the same text. Client input is refused instead (``is_storable``):
a 400 that names the field, never a 500.
"""

from __future__ import annotations

import re

REPLACEMENT = "\ufffd"
# What a refused input is told.
UNSTORABLE = "must not contain NUL characters or unpaired surrogates"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str) -> str:
    """``text`` with every NUL and unpaired surrogate replaced by U+FFFD."""
    if _UNSTORABLE.search(text) is None:
        return text
    return _UNSTORABLE.sub(REPLACEMENT, text)


def is_storable(text: str) -> bool:
    return _UNSTORABLE.search(text) is None
