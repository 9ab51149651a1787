"""What the harness needs from the product's database: users with tokens, empty
conversations to post into, and the persisted content to check streams against.

The harness configures Django exactly like the servers it starts (same environment), so
it reads and writes the same database. Every simulated user is its own account with one
conversation (concurrent streams are concurrent users, as in production: one user posting
a thousand messages at once would only measure the per-user limit's lock). Accounts are
created in bulk beforehand so the measured load is the streaming path (post a message,
stream the answer), not setup.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]


def ensure_database(url: str) -> None:
    """Create the PostgreSQL database named by ``url`` if it does not exist yet."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def setup(env: dict[str, str]) -> None:
    """Migrate the database the servers will use and configure Django in this process."""
    url = env.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        ensure_database(url)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    os.environ.update({k: v for k, v in env.items() if k in ("DATABASE_URL", "VAR_DIR")})
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    import django

    django.setup()


# The server settings that change what a run measures on PostgreSQL's side.
SERVER_SETTINGS = ("autovacuum", "fsync", "synchronous_commit", "shared_buffers")


def server_settings() -> dict[str, str]:
    """The PostgreSQL server's ``SERVER_SETTINGS`` (empty on SQLite). A server with
    autovacuum off (as a CI machine's may be) keeps every dead row version the run
    leaves: its tables and indexes grow through the run, and PostgreSQL's CPU per answer
    with them, where a production server's do not."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
            [list(SERVER_SETTINGS)],
        )
        return dict(cursor.fetchall())


def accounts(count: int) -> list[tuple[str, str]]:
    """``count`` fresh users, each with an API token and one empty conversation: a list
    of (token, conversation id)."""
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    from streaming.models import Conversation

    run = uuid.uuid4().hex[:8]
    users = [User(username=f"bench-{run}-{i}", password="!") for i in range(count)]
    User.objects.bulk_create(users, batch_size=1000)
    users = list(User.objects.filter(username__startswith=f"bench-{run}-").order_by("id"))
    tokens = [Token(key=Token.generate_key(), user=u) for u in users]
    Token.objects.bulk_create(tokens, batch_size=1000)
    rows = [Conversation(owner=u, title="bench") for u in users]
    Conversation.objects.bulk_create(rows, batch_size=1000)
    release()
    return [(t.key, str(c.id)) for t, c in zip(tokens, rows, strict=True)]


def persisted(message_ids: list[str]) -> dict[str, tuple[str, str]]:
    """message id -> (status, content) as stored."""
    from streaming.models import Message

    found: dict[str, tuple[str, str]] = {}
    ids = [m for m in message_ids if m]
    for start in range(0, len(ids), 1000):
        rows = Message.objects.filter(id__in=ids[start : start + 1000]).values_list(
            "id", "status", "content"
        )
        found.update({str(i): (s, c) for i, s, c in rows})
    release()
    return found


def segment_end_times(message_ids: list[str]) -> dict[str, float]:
    """message id -> when its first segment was finalised (epoch seconds)."""
    from streaming.models import Segment

    rows = Segment.objects.filter(message_id__in=message_ids, index=0).values_list(
        "message_id", "ended_at"
    )
    found = {str(m): e.timestamp() for m, e in rows if e is not None}
    release()
    return found


def release() -> None:
    """Close this process's connection: SQLite writers in the servers must not wait on it."""
    from django.db import connection

    connection.close()
