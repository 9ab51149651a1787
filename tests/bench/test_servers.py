"""``bench.servers.machine_usage``: the machine's CPU and the data services' share of it."""

from __future__ import annotations

import pytest
import redis
from django.db import connection

from bench import servers
from tests.conftest import REDIS_URL

# One clock tick per core: what two readings of ``/proc/stat`` may round away.
ROUNDING = 1.0 / servers.CLOCK_TICKS * 2


def grew(before: servers.MachineUsage, after: servers.MachineUsage, name: str) -> float:
    return float(getattr(after, name) - getattr(before, name))


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_query_postgres_runs_is_postgres_cpu_and_machine_cpu() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (DATABASE_URL)")
    with connection.cursor() as cursor:
        before = servers.machine_usage()
        cursor.execute("SELECT count(*) FROM generate_series(1, 3000000)")
        assert cursor.fetchone() == (3_000_000,)
        after = servers.machine_usage()  # the backend still runs: its own CPU counts
    postgres = grew(before, after, "postgres_seconds")
    assert postgres > 0
    assert grew(before, after, "busy_seconds") >= postgres - ROUNDING
    assert after.at > before.at


@pytest.mark.redis
def test_a_script_redis_runs_is_redis_cpu(needs_redis: None) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        before = servers.machine_usage()
        counted = client.eval("local i = 0 while i < 10000000 do i = i + 1 end return i", 0)
        after = servers.machine_usage()
    finally:
        client.close()
    assert counted == 10_000_000
    redis_cpu = grew(before, after, "redis_seconds")
    assert redis_cpu > 0
    assert grew(before, after, "busy_seconds") >= redis_cpu - ROUNDING
