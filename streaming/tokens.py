"""API tokens resolved without a database trip on every request, where that is safe.

A token's user is kept in the process for ``TOKEN_CACHE_SECONDS`` after a lookup (never a
key that was not found: a new token works at once). Revocation is exact up to control's
delivery: deleting a token or giving it to another user, or saving or deleting its user
(deactivated, rights changed, removed), drops that user's entries here at once and, once
the change is committed, in every process through control (milliseconds). A lookup that
was under way when its user was revoked is not kept, so a stale read cannot come back
after the revocation. Only a process that misses the control message (its Redis
connection was down) can keep an entry, for ``TOKEN_CACHE_SECONDS`` at most; so can a
change made outside Django's signals (plain SQL, a queryset's ``update()``).

Each hit is a fresh ``User`` built from the cached column values (``Model.from_db``): no
two requests share an instance.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from django.db import connections, router

from streaming.rows import Reader, columns
from streaming.storable import is_storable

# Entries kept at most (least recently used go first).
MAX_ENTRIES = 10_000
# The control message that drops a user's entries in every process: {"type", "user"}.
REVOKED = "tokens_revoked"


class TokenCache:
    def __init__(self, seconds: float, max_entries: int = MAX_ENTRIES) -> None:
        self.seconds = seconds
        self.max_entries = max_entries
        # key -> (expires at, user id, the user's column values)
        self._entries: OrderedDict[str, tuple[float, int, tuple[Any, ...]]] = OrderedDict()
        # user id -> when its entries were last dropped (kept for ``seconds``)
        self._revoked: dict[int, float] = {}
        self._lock = threading.Lock()
        # Told a revoked user's id once its change is committed (the runtime sends it to
        # every process over control).
        self.broadcast: Callable[[int], None] | None = None

    def cached(self, key: str) -> Any | None:
        """The user of token ``key`` when this process holds it now, else None (not known
        here: ask ``user_for``). No query, so the event loop may call it."""
        if self.seconds <= 0:
            return None
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] <= time.monotonic():
                return None
            self._entries.move_to_end(key)
        from django.contrib.auth import get_user_model

        model = get_user_model()
        return model.from_db("default", self._fields(model), entry[2])

    def user_for(self, key: str) -> Any | None:
        """The user of token ``key`` (active or not: the caller refuses an inactive one),
        or None when there is no such token. Synchronous: a database thread calls it, and
        on a miss it queries."""
        now = time.monotonic()
        user = self.cached(key)
        if user is not None:
            return user
        user = _lookup(key)
        if user is not None and user.is_active and self.seconds > 0:
            self._keep(key, user, looked_up_at=now)
        return user

    def _keep(self, key: str, user: Any, looked_up_at: float) -> None:
        values = tuple(getattr(user, field.attname) for field in user._meta.concrete_fields)
        with self._lock:
            if self._revoked.get(user.pk, float("-inf")) >= looked_up_at:
                return  # revoked while this lookup ran: what it read may be stale
            self._entries[key] = (looked_up_at + self.seconds, user.pk, values)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    @staticmethod
    def _fields(model: Any) -> list[str]:
        return [field.attname for field in model._meta.concrete_fields]

    def forget_user(self, user_id: int) -> None:
        """Drop every entry of ``user_id`` in this process, and the lookups under way."""
        now = time.monotonic()
        with self._lock:
            self._revoked[user_id] = now
            for key in [k for k, entry in self._entries.items() if entry[1] == user_id]:
                del self._entries[key]
            for uid in [u for u, at in self._revoked.items() if at < now - self.seconds]:
                del self._revoked[uid]

    def revoked(self, user_id: int) -> None:
        """A change to ``user_id`` or one of its tokens: forget it here now, and here and
        everywhere once the change is committed."""
        from django.db import transaction

        self.forget_user(user_id)

        def committed() -> None:
            self.forget_user(user_id)
            if self.broadcast is not None:
                self.broadcast(user_id)

        transaction.on_commit(committed)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._revoked.clear()


@functools.cache
def _lookup_reader(alias: str) -> Reader[Any]:
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    connection = connections[alias]
    name = connection.ops.quote_name
    user = get_user_model()
    users, keys = name(user._meta.db_table), name(Token._meta.db_table)
    token_user = Token._meta.get_field("user")
    key = Token._meta.get_field("key")
    sql = (
        f"SELECT {columns(connection, user, users)} FROM {users} INNER JOIN {keys}"
        f" ON {keys}.{name(token_user.column)} = {users}.{name(user._meta.pk.column)}"
        f" WHERE {keys}.{name(key.column)} = %s"
    )
    return Reader(user, alias, sql)


def _lookup(key: str) -> Any | None:
    """The user of token ``key`` from the database (None: no such token), by SQL built
    once: the ORM compiled ``Token.objects.select_related("user").get(key=...)`` anew for
    every lookup, several times the cost of the query itself. The reader applies the
    fields' converters, so the user is what that query would give."""
    from rest_framework.authtoken.models import Token

    if not is_storable(key):
        return None  # no stored key holds such text, and the database would refuse it
    alias = router.db_for_read(Token)
    rows = _lookup_reader(alias).fetch([key])
    return rows[0] if rows else None


_cache: TokenCache | None = None
_building = threading.Lock()


def cache() -> TokenCache:
    """This process's token cache, built on first use from the settings."""
    global _cache
    if _cache is None:
        with _building:
            if _cache is None:
                from streaming.conf import streaming_settings

                _cache = TokenCache(streaming_settings.TOKEN_CACHE_SECONDS)
    return _cache


def token_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    cache().revoked(instance.user_id)


# Set on a token being saved: its owner before the save (None: a new token).
_PREVIOUS_OWNER = "_streaming_previous_owner"


def token_saving(sender: Any, instance: Any, **kwargs: Any) -> None:
    """Before a token is saved: whose it is now (``token_saved`` compares)."""
    from rest_framework.authtoken.models import Token

    previous = None
    if not instance._state.adding and instance.key:
        # By its key: the proxy's ``pk`` is its user's id.
        stored = Token.objects.filter(key=instance.key).values_list("user_id").first()
        previous = None if stored is None else stored[0]
    setattr(instance, _PREVIOUS_OWNER, previous)


def token_saved(sender: Any, instance: Any, **kwargs: Any) -> None:
    """A token given to another user (the admin's token page can) is its old owner's no
    longer: their entries go, and their open streams check their credentials again. After
    the row changed, so that what those checks read is the new owner."""
    previous = instance.__dict__.pop(_PREVIOUS_OWNER, None)
    if previous is not None and previous != instance.user_id:
        cache().revoked(previous)


def user_changed(sender: Any, instance: Any, created: bool = False, **kwargs: Any) -> None:
    if instance.pk is not None and not created:  # a new user has no entries yet
        cache().revoked(instance.pk)


def logged_out(sender: Any, request: Any, user: Any = None, **kwargs: Any) -> None:
    """A logout ends the access of the sockets opened with its session: they check their
    credentials again, as after a revocation. Django sends this signal before it flushes
    the session, so the session is flushed here first: the recheck must find it gone
    (flushing it again after is a no-op)."""
    if user is None or user.pk is None:
        return
    request.session.flush()
    cache().revoked(user.pk)
