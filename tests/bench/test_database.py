"""``bench.database.server_settings``: what the run's PostgreSQL server was set to."""

from __future__ import annotations

import pytest
from django.db import connection

from bench import database


@pytest.mark.django_db
def test_the_servers_settings_are_read_as_it_shows_them() -> None:
    settings = database.server_settings()
    if connection.vendor != "postgresql":
        assert settings == {}
        return
    assert set(settings) == set(database.SERVER_SETTINGS)
    with connection.cursor() as cursor:
        for name, value in settings.items():
            cursor.execute(f"SHOW {name}")
            assert cursor.fetchone()[0] == value
