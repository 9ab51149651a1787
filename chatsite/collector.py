"""The garbage collector of a serving process, set for a process that allocates without
pause.

A serving process allocates a few objects per token and many per request (futures,
handles, coroutines, Django's request objects), nearly all freed by reference counting,
so Python's default of a young-generation collection every 700 allocations ran
collections hundreds of times a second, and every older collection walked the whole
of Django, DRF, Twisted and the rest loaded at start (hundreds of thousands of objects
that live as long as the process). ``tune`` moves everything alive once the application
is built into the permanent generation (``gc.freeze``), which collections skip, and
collects the young generation every ``young`` allocations; cycles are still collected,
a little later. ``young`` 0 keeps Python's own settings. Measured in
``docs/performance.md``.
"""

from __future__ import annotations

import gc

# Young collections between collections of the next generation, for each older one.
OLDER = 20


def tune(young: int) -> None:
    """Call once, after the application is built and before it serves."""
    if young <= 0:
        return
    gc.collect()  # what is garbage already need not live forever in the frozen set
    gc.freeze()
    gc.set_threshold(young, OLDER, OLDER)
