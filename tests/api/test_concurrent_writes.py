"""Writes to one conversation at the same moment, over real sockets against a real Daphne
process: a rename, a post, a regenerate, an edit, a Continue and a delete each either
happen whole or are refused with a 4xx, never a 500 (a deadlock between their locks),
and none undoes another (a rename written back over by a regenerate that read the
conversation before it waited)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import httpx
import pytest
from django.db import connection, transaction

from streaming import statements
from streaming.models import Conversation, Message
from streaming.streamlog.redis import stream_key
from tests.api.calls import client, new_conversation, post, redis_client

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 8
SHORT = {"simulation": {"length": 3, "ttft_ms": 0, "tokens_per_second": 1000}}
LONG = {"simulation": {"length": 400, "ttft_ms": 0, "tokens_per_second": 200}}


def at_once(*requests: Callable[[], httpx.Response]) -> list[httpx.Response]:
    """The requests sent together, one thread each, released by one barrier."""
    barrier = threading.Barrier(len(requests))
    answers: list[Any] = [None] * len(requests)

    def send(i: int) -> None:
        barrier.wait()
        answers[i] = requests[i]()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def answered(api: httpx.Client, conversation: str) -> dict[str, Any]:
    response = post(api, conversation, "q", wait=True, params=SHORT)
    assert response.status_code == 201, response.text
    return response.json()


def test_no_write_fails_or_undoes_another_when_sent_at_once(daphne, account) -> None:
    server = daphne()
    with client(server, account.token) as api, client(server, account.token) as other:
        conversation = new_conversation(api)
        answer = answered(api, conversation)["message"]["id"]
        for i in range(ROUNDS):
            title = f"renamed {i}"
            renamed, regenerated = at_once(
                partial(other.patch, f"/api/conversations/{conversation}/", json={"title": title}),
                partial(
                    api.post,
                    f"/api/messages/{answer}/regenerate/?wait=true",
                    json={"params": SHORT},
                ),
            )
            assert (renamed.status_code, regenerated.status_code) == (200, 201), (
                renamed.text,
                regenerated.text,
            )
            assert api.get(f"/api/conversations/{conversation}/").json()["title"] == title

        for _ in range(ROUNDS):
            conversation = new_conversation(api)
            made = answered(api, conversation)
            question = made["user_message"]["id"]
            posted, edited = at_once(
                partial(post, other, conversation, "next", params=LONG),
                partial(
                    api.post,
                    f"/api/messages/{question}/edit/",
                    json={"content": "again", "params": LONG},
                ),
            )
            # Whichever comes second is refused: the other's answer streams below or above.
            statuses = sorted([posted.status_code, edited.status_code])
            assert statuses == [201, 409], (posted.text, edited.text)
            made = posted if posted.status_code == 201 else edited
            api.post(f"/api/messages/{made.json()['message']['id']}/cancel/")


def test_a_delete_at_once_with_a_write_leaves_nothing_behind(daphne, account) -> None:
    server = daphne()
    redis = redis_client()
    writes: dict[str, Callable[[httpx.Client, str, dict[str, Any]], httpx.Response]] = {
        "regenerate": lambda api, _, made: api.post(
            f"/api/messages/{made['message']['id']}/regenerate/", json={"params": LONG}
        ),
        "continue": lambda api, _, made: api.post(
            f"/api/messages/{made['message']['id']}/continue/"
        ),
        "post": lambda api, conversation, _: post(api, conversation, "more", params=LONG),
    }
    with client(server, account.token) as api, client(server, account.token) as other:
        for i in range(ROUNDS * len(writes)):
            name = list(writes)[i % len(writes)]
            conversation = new_conversation(api)
            cut = post(api, conversation, "q", wait=True, params={"max_tokens": 2, **LONG})
            made = cut.json()
            write, deleted = at_once(
                partial(writes[name], api, conversation, made),
                partial(other.delete, f"/api/conversations/{conversation}/"),
            )
            assert deleted.status_code == 204, deleted.text
            # The write came first (and its answer was stopped by the delete) or found
            # the conversation gone.
            assert write.status_code in (201, 202, 404), (name, write.text)
            assert not Conversation.objects.filter(pk=conversation).exists()
            started = [made["message"]["id"]]
            if write.status_code in (201, 202):
                body = write.json()
                started.append((body.get("message") or body)["id"])
            assert not Message.objects.filter(id__in=started).exists()
            if redis is not None:
                left = [m for m in started if redis.exists(stream_key(m))]
                assert left == [], f"{name}: the logs of deleted answers are still there"


def test_a_rename_committed_while_a_regenerate_waits_for_it_is_kept(daphne, account) -> None:
    """A regenerate that arrives while a rename holds the conversation's lock writes the
    conversation after it: it reads the conversation once it has the lock, so the
    rename is not written back over with the title it read before it waited."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite's write transactions hold the whole database from their start")
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        answer = answered(api, conversation)["message"]["id"]
        result: dict[str, httpx.Response] = {}
        regenerating = threading.Thread(
            target=lambda: result.update(
                regenerated=api.post(f"/api/messages/{answer}/regenerate/", json={"params": SHORT})
            )
        )
        with transaction.atomic():
            # What a rename holds: the conversation's row and its owner's.
            assert statements.lock_conversation(account.user.pk, conversation) is not None
            Conversation.objects.filter(pk=conversation).update(
                title="held rename", title_source=Conversation.TitleSource.USER
            )
            regenerating.start()
            with connection.cursor() as cursor:
                waiting = 0
                while not waiting and regenerating.is_alive():
                    cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
                    waiting = cursor.fetchone()[0]
            assert waiting, "the regenerate did not wait for the rename's lock"
        regenerating.join()
        assert result["regenerated"].status_code == 201, result["regenerated"].text
        shown = api.get(f"/api/conversations/{conversation}/").json()
        assert (shown["title"], shown["title_source"]) == ("held rename", "user")


def test_a_stop_first_beside_another_write_is_never_taken_for_a_dead_process(
    daphne, account
) -> None:
    """An edit that stops the branch first, sent with a post: the answer the post starts
    after the stop is not one the stop failed to end (a 503 saying the process may be
    gone), but one the edit finds streaming (a 409), or the edit came first."""
    server = daphne(MAX_CONCURRENT_GENERATIONS_PER_USER="100")
    with client(server, account.token) as api, client(server, account.token) as other:
        for _ in range(ROUNDS):
            conversation = new_conversation(api)
            streaming = post(api, conversation, "q", params=LONG).json()
            question = streaming["user_message"]["id"]
            edited, posted = at_once(
                partial(
                    api.post,
                    f"/api/messages/{question}/edit/",
                    json={"content": "again", "stop": True, "params": LONG},
                ),
                partial(post, other, conversation, "next", params=LONG),
            )
            assert edited.status_code in (201, 409), edited.text
            assert posted.status_code in (201, 409), posted.text
            for made in (edited, posted):
                if made.status_code == 201:
                    api.post(f"/api/messages/{made.json()['message']['id']}/cancel/")


def test_of_two_deletes_at_once_one_deletes_and_the_other_finds_nothing(daphne, account) -> None:
    server = daphne()
    with client(server, account.token) as api, client(server, account.token) as other:
        for _ in range(ROUNDS):
            conversation = new_conversation(api)
            answered(api, conversation)
            url = f"/api/conversations/{conversation}/"
            first, second = at_once(partial(api.delete, url), partial(other.delete, url))
            assert sorted([first.status_code, second.status_code]) == [204, 404], (
                first.text,
                second.text,
            )
