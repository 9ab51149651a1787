"""What every Redis client of the product is built with: one more try of a command whose
connection was found closed.

A pool keeps its connections across a Redis restart, a failover or a proxy's idle
timeout, and cannot tell they are dead until one is used: the first command on each then
failed with ``ConnectionError: Connection closed by server``, long after Redis was back
(a reader's replay ended without its events, a Stop answered 500, ``/readyz`` said Redis
was down). With ``reconnecting()`` the client opens a new connection and sends the
command once more. A command that fails again raises as before (Redis is down: the
callers' own waits apply), and a timeout is not tried again: a slow Redis would only be
waited for twice. The appends' scripts go out on a connection of their own, without
this: only the log knows a batch sent again may find its events there.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as ConnectionClosed


def reconnecting() -> dict[str, Any]:
    """Keyword arguments for a client or a pool (``from_url``): a command whose connection
    was found closed is sent once more on a new one."""
    return {
        "retry": Retry(NoBackoff(), 1, supported_errors=(ConnectionClosed,)),
        "retry_on_error": [ConnectionClosed],
    }
