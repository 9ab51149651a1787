"""Parallel test workers (pytest-xdist): ``make test`` loads this module with ``-p`` and
runs ``-n 3 --dist loadscope``; ``tests/conftest.py`` refuses a parallel run without it.

- **Redis.** Decided before Django reads its settings (a ``-p`` module is imported ahead
  of pytest-django). Keys in Redis are per message, so workers could share one Redis, but
  the control channel is not: a user feed event of one worker's user 1 would reach the
  other worker's user 1. Every worker but the first runs a private ``redis-server`` and
  points ``REDIS_URL`` at it (the first keeps the suite's), so one worker is unchanged.
- **Scheduling** (``Grouped``): tests go out a module at a time, so module fixtures start
  their servers once; all of ``tests/vllm`` on one worker, which starts the real vLLM
  server once; all of ``tests/e2e`` on one worker, so one Chromium runs at a time.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from tests.support.redis import PrivateRedis, free_port

# Directories whose tests all run on one worker, each its own unit of work.
TOGETHER = ("tests/vllm/", "tests/e2e/")


def _private_redis_for_worker() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker or worker == "gw0" or not os.environ.get("REDIS_URL"):
        return
    server = PrivateRedis(free_port()).start()
    atexit.register(server.stop)
    os.environ["REDIS_URL"] = server.url


_private_redis_for_worker()


class Grouped(LoadScopeScheduling):
    """``loadscope`` with a module as the unit of work, and the ``TOGETHER`` directories
    each one unit."""

    def _split_scope(self, nodeid: str) -> str:
        for directory in TOGETHER:
            if nodeid.startswith(directory):
                return directory
        return nodeid.split("::", 1)[0]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Grouped | None:
    return Grouped(config, log) if config.getvalue("dist") == "loadscope" else None
