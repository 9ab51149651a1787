"""The token cache: a hit costs no query and is a user of its own; a deleted token, a
deactivated or deleted user, and a lookup overtaken by a revocation are never served."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token, TokenProxy

from streaming import tokens
from streaming.tokens import TokenCache

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch) -> TokenCache:
    """The process's cache, emptied (the signals act on it), keeping what it looks up
    whatever the suite's settings say (the embedded defaults keep nothing)."""
    made = tokens.cache()
    made.clear()
    monkeypatch.setattr(made, "seconds", 30.0)
    return made


@pytest.fixture
def token() -> Token:
    user = User.objects.create_user("tok", password="pw-123456")
    return Token.objects.create(user=user)


def queries(call):
    with CaptureQueriesContext(connection) as captured:
        result = call()
    return result, len(captured)


def test_a_hit_costs_no_query_and_is_a_user_of_its_own(cache, token):
    first, counted = queries(lambda: cache.user_for(token.key))
    assert (first.pk, counted) == (token.user_id, 1)
    second, counted = queries(lambda: cache.user_for(token.key))
    assert counted == 0
    assert second is not first and second.pk == first.pk and second.username == "tok"
    assert not second._state.adding, "loaded, not new: saving it updates the row"
    second.first_name = "changed"
    assert cache.user_for(token.key).first_name == "", "no request sees another's edits"


def test_an_unknown_key_is_never_cached(cache, token):
    assert cache.user_for("0" * 40) is None
    made = Token.objects.create(user=User.objects.create_user("later"), key="0" * 40)
    assert cache.user_for(made.key).username == "later", "a new token works at once"


def test_a_deleted_token_is_gone_at_once(cache, token):
    key = token.key
    assert cache.user_for(key) is not None
    token.delete()  # leaves token.key None
    found, counted = queries(lambda: cache.user_for(key))
    assert (found, counted) == (None, 1)


@pytest.mark.parametrize("model", [Token, TokenProxy])  # the admin saves the proxy
def test_a_token_given_to_another_user_is_theirs_at_once(cache, token, model):
    """Its old owner's entries go (and their streams are checked again, by the same
    revocation): the key resolves to its new user on the next request."""
    assert cache.user_for(token.key).pk == token.user_id
    moved = model.objects.get(pk=token.pk)
    moved.user = User.objects.create_user("new-owner")
    moved.save()
    found, counted = queries(lambda: cache.user_for(token.key))
    assert (found.username, counted) == ("new-owner", 1)


def test_a_key_no_row_can_hold_is_unknown_without_a_query(cache):
    """NUL and unpaired surrogates: PostgreSQL would refuse the query itself."""
    for key in ("a\x00b", "\ud800"):
        assert queries(lambda key=key: cache.user_for(key)) == (None, 0)


def test_a_deactivated_user_is_refused_at_once(cache, token):
    assert cache.user_for(token.key).is_active
    user = User.objects.get(pk=token.user_id)
    user.is_active = False
    user.save()
    found, counted = queries(lambda: cache.user_for(token.key))
    assert (found.is_active, counted) == (False, 1), "seen inactive at once, from the row"
    _, counted = queries(lambda: cache.user_for(token.key))
    assert counted == 1, "an inactive user is never cached"


def test_a_deleted_user_takes_its_tokens_along(cache, token):
    assert cache.user_for(token.key) is not None
    User.objects.filter(pk=token.user_id).delete()
    assert cache.user_for(token.key) is None


def test_a_lookup_overtaken_by_a_revocation_is_not_kept(cache, token):
    """A lookup reads the row, the user is revoked, then the lookup would keep what it read:
    it must not, or the revocation would be undone for the cache's lifetime."""
    user = User.objects.get(pk=token.user_id)
    cache.forget_user(user.pk)  # revoked after the lookup below started...
    cache._keep(token.key, user, looked_up_at=0.0)  # ...which started at time 0
    _, counted = queries(lambda: cache.user_for(token.key))
    assert counted == 1


def test_a_zero_lifetime_never_caches(token):
    off = TokenCache(0)
    assert off.user_for(token.key).pk == token.user_id
    _, counted = queries(lambda: off.user_for(token.key))
    assert counted == 1


def test_entries_are_bounded(token):
    small = TokenCache(60, max_entries=2)
    keys = [Token.objects.create(user=User.objects.create_user(f"u{n}")).key for n in range(3)]
    for key in keys:
        small.user_for(key)
    _, counted = queries(lambda: small.user_for(keys[0]))
    assert counted == 1, "the least recently used entry went first"
    _, counted = queries(lambda: small.user_for(keys[2]))
    assert counted == 0


def test_a_lookup_reads_the_user_as_the_orm_does(cache, token):
    user = User.objects.get(pk=token.user_id)
    user.last_login = user.date_joined
    user.is_staff = True
    user.save()
    expected = Token.objects.select_related("user").get(key=token.key).user
    found, counted = queries(lambda: cache.user_for(token.key))
    assert counted == 1
    for field in User._meta.concrete_fields:
        assert getattr(found, field.attname) == getattr(expected, field.attname), field.name
        assert type(getattr(found, field.attname)) is type(getattr(expected, field.attname))


def test_cached_answers_only_from_what_the_process_holds(cache, token):
    assert queries(lambda: cache.cached(token.key)) == (None, 0), "never looked up: unknown"
    cache.user_for(token.key)
    held, counted = queries(lambda: cache.cached(token.key))
    assert (held.pk, counted) == (token.user_id, 0)
    token.delete()
    assert cache.cached(token.key) is None
