"""Stop-sequence hold-back for streamed text.

A stop string can arrive spread over several deltas ("E", "N", "D"); text that might be the
start of one must not be shown until it is known not to be. `StopFilter` holds back the
shortest tail that could still begin a match, so the delay is bounded by the longest stop
string, and each feed scans only that tail plus the new text.

Where stop strings overlap ("abcd" and "bc", or "ab" and "abc") the result does not depend on
how the text was split into deltas: the match that starts earliest wins, the longest at the
same position, and a complete match waits while a longer or earlier one can still complete.
"""

from __future__ import annotations

import re


class StopFilter:
    """Cuts a stream of text at the first stop string, hiding the stop string itself.

    After a match (from `feed` or `flush`) the filter is finished: `matched` holds the stop
    string and further feeds return nothing.
    """

    __slots__ = ("_longest_first", "_pending", "_prefixes", "_starts", "finished", "matched")

    def __init__(self, stops: list[str]) -> None:
        unique = {stop for stop in stops if stop}
        # Longest first: on a tie in position the first one found is the one reported.
        self._longest_first = sorted(unique, key=lambda stop: (-len(stop), stop))
        self._prefixes = frozenset(stop[:i] for stop in unique for i in range(1, len(stop)))
        # Finds the next character that can begin a stop string, at C speed.
        self._starts = re.compile("|".join(sorted({re.escape(stop[0]) for stop in unique})))
        self._pending = ""
        self.finished = False
        self.matched: str | None = None

    def feed(self, text: str) -> tuple[str, str | None]:
        """Return the text safe to show now and the stop string matched by this feed."""
        if self.finished:
            return "", None
        if not self._longest_first:
            return text, None
        if not self._pending and self._starts.search(text) is None:
            return text, None  # the common case: nothing here can begin a stop string
        buf = self._pending + text
        at, stop = self._earliest_match(buf)
        # A tail that may still grow into a match (or into an earlier/longer one) waits.
        wait = self._candidate_start(buf, upto=at)
        if wait is not None:
            self._pending = buf[wait:]
            return buf[:wait], None
        self._pending = ""
        if stop is None:
            return buf, None
        self.finished = True
        self.matched = stop
        return buf[:at], stop

    def flush(self) -> str:
        """Release what was held back because generation ended; sets `matched` if the held
        text turns out to contain a stop string (only possible with overlapping stops)."""
        if self.finished:
            return ""
        self.finished = True
        buf, self._pending = self._pending, ""
        at, stop = self._earliest_match(buf)
        if stop is None:
            return buf
        self.matched = stop
        return buf[:at]

    def _earliest_match(self, buf: str) -> tuple[int, str | None]:
        best_at, best = len(buf), None
        for stop in self._longest_first:
            # Only a match starting strictly before the best so far can replace it.
            found = buf.find(stop, 0, best_at - 1 + len(stop))
            if found != -1:
                best_at, best = found, stop
        return best_at, best

    def _candidate_start(self, buf: str, upto: int) -> int | None:
        """Earliest index <= ``upto`` whose suffix is a proper prefix of some stop string."""
        size = len(buf)
        longest_prefix = len(self._longest_first[0]) - 1
        start, end = max(0, size - longest_prefix), min(upto, size - 1) + 1
        while (found := self._starts.search(buf, start, end)) is not None:
            if buf[found.start() :] in self._prefixes:
                return found.start()
            start = found.start() + 1
        return None
