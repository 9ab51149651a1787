"""Conversations as trees over the REST API, against a real Daphne process and the vLLM
emulator (which records what the engine received): regenerate, edit, branch switching,
what each answer's prompt holds, and who may touch which message."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.calls import assert_error, client, new_conversation
from tests.badinput.test_ws_frames import respellings
from tests.emulator.server import wait_for_request_end

pytestmark = pytest.mark.django_db(transaction=True)


def ask(text: str, tokens: int = 4) -> str:
    """A question the emulator answers with ``tokens`` tokens of its default text."""
    return f'[[emu {{"tokens": {tokens}, "tokens_per_second": 0}}]] {text}'


def created(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 201, response.text
    return response.json()


def post_and_wait(api: httpx.Client, conversation: str, content: str) -> dict[str, Any]:
    return created(
        api.post(
            f"/api/conversations/{conversation}/messages/?wait=true", json={"content": content}
        )
    )


def branch(api: httpx.Client, conversation: str, *, tree: bool = False) -> list[dict[str, Any]]:
    url = f"/api/conversations/{conversation}/messages/" + ("?tree=true" if tree else "")
    response = api.get(url)
    assert response.status_code == 200, response.text
    return response.json()["results"]


def prompt_of(emulator: str, message_id: str, segment: int = 0) -> list[tuple[str, str]]:
    record = wait_for_request_end(emulator, f"{message_id}.{segment}", 10)
    return [(m["role"], m["content"]) for m in record["body"]["messages"]]


@pytest.fixture
def three_turns(daphne, account, emulator):
    """A conversation of three questions and answers, and a client for its owner."""
    server = daphne(ENGINE_URL=emulator, ENGINE_MODEL="test-model")
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        turns = [post_and_wait(api, conversation, ask(f"question {i}")) for i in (1, 2, 3)]
        yield api, conversation, turns, server


def test_a_linear_conversation_is_one_branch_of_only_children(three_turns) -> None:
    api, conversation, turns, _ = three_turns
    messages = branch(api, conversation)
    ids = [m["id"] for m in messages]
    assert ids == [x for t in turns for x in (t["user_message"]["id"], t["message"]["id"])]
    assert [m["parent_id"] for m in messages] == [None, *ids[:-1]]
    assert all(m["siblings"] == [m["id"]] for m in messages)
    assert [m["id"] for m in branch(api, conversation, tree=True)] == ids
    assert api.get(f"/api/conversations/{conversation}/").json()["current_leaf"] == ids[-1]


def test_regenerate_adds_an_answer_beside_the_old_one_and_shows_it(three_turns, emulator) -> None:
    api, conversation, turns, _ = three_turns
    question, old = turns[1]["user_message"], turns[1]["message"]
    answer = created(api.post(f"/api/messages/{old['id']}/regenerate/?wait=true", json={}))
    new = answer["message"]
    assert new["parent_id"] == question["id"]
    assert new["siblings"] == [old["id"], new["id"]]
    assert new["status"] == "complete" and new["stream"]["message_id"] == new["id"]

    # The engine got the path to the question: nothing of the old answer or later turns.
    first = turns[0]
    assert prompt_of(emulator, new["id"]) == [
        ("user", first["user_message"]["content"]),
        ("assistant", first["message"]["content"]),
        ("user", question["content"]),
    ]
    shown = branch(api, conversation)
    assert [m["id"] for m in shown] == [
        first["user_message"]["id"], first["message"]["id"], question["id"], new["id"],
    ]  # fmt: skip
    assert shown[-1]["siblings"] == [old["id"], new["id"]]
    assert len(branch(api, conversation, tree=True)) == 7, "every branch is kept"

    # A new question goes after the branch shown; its prompt has no text from the other.
    after = post_and_wait(api, conversation, ask("question 4"))
    assert after["user_message"]["parent_id"] == new["id"]
    contents = [c for _, c in prompt_of(emulator, after["message"]["id"])]
    assert turns[2]["user_message"]["content"] not in contents
    assert contents[-2:] == [new["content"], after["user_message"]["content"]]


def test_regenerate_takes_new_params_or_keeps_the_old_ones(three_turns, emulator) -> None:
    api, _, turns, _ = three_turns
    old = turns[0]["message"]
    answer = created(
        api.post(
            f"/api/messages/{old['id']}/regenerate/?wait=true",
            json={"params": {"max_tokens": 2, "temperature": 0.3}},
        )
    )["message"]
    assert answer["params"] == {"max_tokens": 2, "temperature": 0.3}
    assert answer["status"] == "truncated"
    body = wait_for_request_end(emulator, f"{answer['id']}.0", 10)["body"]
    assert (body["max_tokens"], body["temperature"]) == (2, 0.3)
    again = created(api.post(f"/api/messages/{answer['id']}/regenerate/?wait=true"))["message"]
    assert again["params"] == answer["params"], "no params: the regenerated answer's"
    assert again["siblings"] == [old["id"], answer["id"], again["id"]]


def test_edit_adds_a_question_beside_the_old_one_with_its_answer(three_turns, emulator) -> None:
    api, conversation, turns, _ = three_turns
    old = turns[1]["user_message"]
    edited = created(
        api.post(f"/api/messages/{old['id']}/edit/?wait=true", json={"content": ask("changed")})
    )
    question, answer = edited["user_message"], edited["message"]
    assert question["parent_id"] == turns[0]["message"]["id"]
    assert question["siblings"] == [old["id"], question["id"]]
    assert answer["parent_id"] == question["id"] and answer["status"] == "complete"
    assert prompt_of(emulator, answer["id"]) == [
        ("user", turns[0]["user_message"]["content"]),
        ("assistant", turns[0]["message"]["content"]),
        ("user", ask("changed")),
    ]
    assert [m["id"] for m in branch(api, conversation)][-2:] == [question["id"], answer["id"]]

    # The first question can be edited too: the roots are siblings.
    root = created(
        api.post(
            f"/api/messages/{turns[0]['user_message']['id']}/edit/?wait=true",
            json={"content": ask("a new start")},
        )
    )["user_message"]
    assert root["parent_id"] is None
    assert root["siblings"] == [turns[0]["user_message"]["id"], root["id"]]
    assert branch(api, conversation)[0]["id"] == root["id"]


def test_a_post_goes_after_the_answer_it_names(three_turns, emulator) -> None:
    """``parent_id``: the question goes after the answer the client shows, whichever
    branch another client switched to since; an earlier answer makes a branch there."""
    api, conversation, turns, _ = three_turns
    url = f"/api/conversations/{conversation}/messages/?wait=true"
    first, second = turns[0], turns[1]
    # Another client shows the second turn's new version (the current leaf moves there)...
    regenerated = created(
        api.post(f"/api/messages/{second['message']['id']}/regenerate/?wait=true")
    )["message"]
    # ...while this one still shows the third turn, and posts after it.
    below = created(
        api.post(url, json={"content": ask("after three"), "parent_id": turns[2]["message"]["id"]})
    )
    assert below["user_message"]["parent_id"] == turns[2]["message"]["id"]
    assert below["user_message"]["siblings"] == [below["user_message"]["id"]]
    assert regenerated["parent_id"] == second["user_message"]["id"]
    path = [(m["role"], m["content"]) for t in turns for m in (t["user_message"], t["message"])]
    assert prompt_of(emulator, below["message"]["id"]) == [*path, ("user", ask("after three"))]
    assert (
        api.get(f"/api/conversations/{conversation}/").json()["current_leaf"]
        == (below["message"]["id"])
    )

    # After the first answer: a new branch beside the second question, its prompt the
    # path down to that answer, shown as the current leaf.
    early = created(
        api.post(url, json={"content": ask("instead"), "parent_id": first["message"]["id"]})
    )
    question, answer = early["user_message"], early["message"]
    assert question["parent_id"] == first["message"]["id"]
    assert question["siblings"] == [second["user_message"]["id"], question["id"]]
    assert prompt_of(emulator, answer["id"]) == [
        ("user", first["user_message"]["content"]),
        ("assistant", first["message"]["content"]),
        ("user", ask("instead")),
    ]
    shown = [m["id"] for m in branch(api, conversation)]
    assert shown == [
        first["user_message"]["id"],
        first["message"]["id"],
        question["id"],
        answer["id"],
    ]
    # Null is the current leaf, as without it.
    plain = created(api.post(url, json={"content": ask("next"), "parent_id": None}))
    assert plain["user_message"]["parent_id"] == answer["id"]


def test_a_post_after_what_is_not_an_answer_of_the_conversation_is_refused(
    three_turns, other_account
) -> None:
    api, conversation, turns, server = three_turns
    url = f"/api/conversations/{conversation}/messages/"
    elsewhere = new_conversation(api)
    theirs = post_and_wait(api, elsewhere, ask("elsewhere"))["message"]["id"]
    before = len(branch(api, conversation, tree=True))
    refusals = [
        ("not-a-uuid", 400, "invalid", "parent_id"),
        (5, 400, "invalid", "parent_id"),
        (turns[1]["user_message"]["id"], 400, "wrong_role", "parent_id"),
        (theirs, 404, "not_found", "parent_id"),
        ("00000000-0000-0000-0000-000000000000", 404, "not_found", "parent_id"),
        # An answer's id spelt otherwise than the paths take it names none.
        *(
            (other, 404, "not_found", "parent_id")
            for other in respellings(turns[0]["message"]["id"])
        ),
    ]
    for parent, status, code, field in refusals:
        body = {"content": "x", "parent_id": parent}
        assert_error(api.post(url, json=body), status, code, field=field)
        one_step = api.post(url, json=body, headers={"Accept": "text/event-stream"})
        assert_error(one_step, status, code, field=field)
    # A new conversation has nothing to go after: the key is refused, naming it.
    new = {"content": "x", "parent_id": turns[0]["message"]["id"]}
    assert_error(api.post("/api/messages/", json=new), 400, field="parent_id")
    assert_error(
        api.post("/api/messages/", json=new, headers={"Accept": "text/event-stream"}),
        400,
        field="parent_id",
    )
    with client(server, other_account.token) as mallory:
        body = {"content": "mine now", "parent_id": turns[0]["message"]["id"]}
        assert_error(mallory.post(url, json=body), 404)
    assert len(branch(api, conversation, tree=True)) == before, "nothing was added"


def test_a_retried_post_after_an_answer_makes_one_question(three_turns) -> None:
    api, conversation, turns, _ = three_turns
    url = f"/api/conversations/{conversation}/messages/?wait=true"
    body = {"content": ask("once"), "parent_id": turns[0]["message"]["id"]}
    headers = {"Idempotency-Key": "branch-once"}
    made = created(api.post(url, json=body, headers=headers))
    again = created(api.post(url, json=body, headers=headers))
    assert again["user_message"]["id"] == made["user_message"]["id"]
    assert again["message"]["id"] == made["message"]["id"]
    # The same key after another answer is another request.
    elsewhere = {**body, "parent_id": turns[1]["message"]["id"]}
    assert_error(api.post(url, json=elsewhere, headers=headers), 422)
    # So is the same answer's id spelt otherwise, which names no answer.
    for other in respellings(turns[0]["message"]["id"]):
        assert_error(api.post(url, json={**body, "parent_id": other}, headers=headers), 422)
    assert len(branch(api, conversation, tree=True)) == 8


def test_switching_branch_follows_the_latest_answers_and_survives_a_reload(three_turns) -> None:
    api, conversation, turns, _ = three_turns
    old = turns[1]["message"]
    created(api.post(f"/api/messages/{old['id']}/regenerate/?wait=true"))
    url = f"/api/conversations/{conversation}/"
    switched = api.patch(url, json={"current_leaf": old["id"]})
    assert switched.status_code == 200, switched.text
    # The old answer had a third turn below it: the branch goes down to its end.
    assert switched.json()["current_leaf"] == turns[2]["message"]["id"]
    ids = [m["id"] for m in branch(api, conversation)]
    assert ids == [x for t in turns for x in (t["user_message"]["id"], t["message"]["id"])]
    assert api.get(url).json()["current_leaf"] == turns[2]["message"]["id"]


def test_switching_to_a_message_of_another_conversation_is_not_found(
    three_turns, account, other_account
) -> None:
    api, conversation, turns, server = three_turns
    elsewhere = new_conversation(api)
    theirs = post_and_wait(api, elsewhere, ask("elsewhere"))["message"]["id"]
    for leaf in (theirs, "00000000-0000-0000-0000-000000000000", "not-a-uuid"):
        refused = api.patch(f"/api/conversations/{conversation}/", json={"current_leaf": leaf})
        assert refused.status_code in (400, 404), refused.text
    assert_error(
        api.patch(f"/api/conversations/{conversation}/", json={"current_leaf": theirs}),
        404,
        "not_found",
        field="current_leaf",
    )
    with client(server, other_account.token) as mallory:
        assert_error(
            mallory.patch(
                f"/api/conversations/{conversation}/",
                json={"current_leaf": turns[0]["message"]["id"]},
            ),
            404,
        )
        for action, body in (("regenerate", {}), ("edit", {"content": "mine now"})):
            for target in (turns[0]["message"]["id"], turns[0]["user_message"]["id"]):
                assert_error(mallory.post(f"/api/messages/{target}/{action}/", json=body), 404)
    assert len(branch(api, conversation, tree=True)) == 6, "nothing was added"


def test_a_refused_patch_changes_nothing(three_turns) -> None:
    """A branch switch and a field change in one PATCH are one change: when any part is
    refused, none is made; an id that is not a string is a 400 naming it, and a message's
    id spelt otherwise than the paths take it names no message (a 404 naming it)."""
    api, conversation, turns, _ = three_turns
    url = f"/api/conversations/{conversation}/"
    # Two branches, the new one shown: the PATCHes below would switch to the old one.
    created(api.post(f"/api/messages/{turns[1]['message']['id']}/regenerate/?wait=true"))
    before = api.get(url).json()
    first = turns[2]["message"]["id"]
    assert before["current_leaf"] != first
    for body, status, field in (
        ({"current_leaf": first, "model": "no-such-model"}, 400, "model"),
        ({"current_leaf": first, "title": 5}, 400, "title"),
        ({"current_leaf": 123}, 400, "current_leaf"),
        ({"current_leaf": None}, 400, "current_leaf"),
        ({"current_leaf": first, "title": "x" * 201}, 400, "title"),
    ):
        assert_error(api.patch(url, json=body), status, field=field)
        assert api.get(url).json() == before, body
    for other in respellings(first):
        refused = api.patch(url, json={"current_leaf": other, "title": "renamed"})
        assert_error(refused, 404, "not_found", field="current_leaf")
        assert api.get(url).json() == before, other
    switched = api.patch(url, json={"current_leaf": first, "title": "renamed"})
    assert switched.status_code == 200, switched.text
    assert (switched.json()["current_leaf"], switched.json()["title"]) == (first, "renamed")
    assert api.get(url).json() == switched.json()


def test_regenerate_a_question_or_edit_an_answer_is_a_clear_400(three_turns) -> None:
    api, conversation, turns, _ = three_turns
    question, answer = turns[0]["user_message"]["id"], turns[0]["message"]["id"]
    error = assert_error(api.post(f"/api/messages/{question}/regenerate/"), 400, "wrong_role")
    assert "answer" in error["message"]
    error = assert_error(
        api.post(f"/api/messages/{answer}/edit/", json={"content": "x"}), 400, "wrong_role"
    )
    assert "question" in error["message"]
    error = assert_error(api.post(f"/api/messages/{question}/cancel/"), 400, "wrong_role")
    assert "answer" in error["message"]
    assert_error(api.post(f"/api/messages/{question}/edit/", json={}), 400, field="content")
    assert_error(
        api.post(f"/api/messages/{question}/edit/", json={"content": "x", "params": {"top_p": 7}}),
        400,
        field="params.top_p",
    )
    # Keys no field takes: a regenerate has no content, a misplaced parameter goes in params.
    regenerate = api.post(f"/api/messages/{answer}/regenerate/", json={"content": "x"})
    assert_error(regenerate, 400, field="content")
    edit = api.post(f"/api/messages/{question}/edit/", json={"content": "x", "top_p": 0.5})
    assert_error(edit, 400, field="top_p")
    assert len(branch(api, conversation, tree=True)) == 6, "nothing was added"


def test_an_edit_is_answered_by_the_model_it_names(daphne, account, emulator) -> None:
    # The simulated engine answers by default; the emulator serves "test-model".
    server = daphne(ENGINE_MODELS=f'{{"test-model": "{emulator}"}}')
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        question = post_and_wait(api, conversation, "first")["user_message"]["id"]
        url = f"/api/messages/{question}/edit/?wait=true"
        unknown = api.post(url, json={"content": "again", "model": "no-such-model"})
        assert_error(unknown, 400, "invalid_params", field="model")
        edited = created(api.post(url, json={"content": "again", "model": "test-model"}))
        assert edited["message"]["model"] == "test-model"
        assert edited["message"]["status"] == "complete"
        default = created(api.post(url, json={"content": "once more"}))
        assert default["message"]["model"] != "test-model"


def test_a_streaming_branch_is_refused_or_stopped_first(daphne, account) -> None:
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        long = {"simulation": {"length": 2000, "tokens_per_second": 20, "ttft_ms": 0}}
        streaming = created(
            api.post(
                f"/api/conversations/{conversation}/messages/",
                json={"content": "go on", "params": long},
            )
        )
        answer, question = streaming["message"]["id"], streaming["user_message"]["id"]
        error = assert_error(api.post(f"/api/messages/{answer}/regenerate/"), 409, "conflict")
        assert "stop" in error["message"]
        assert_error(api.post(f"/api/messages/{question}/edit/", json={"content": "x"}), 409)
        # A question after it would be answered without the text shown above it.
        follow = api.post(f"/api/conversations/{conversation}/messages/", json={"content": "y"})
        assert answer in assert_error(follow, 409, "conflict")["message"]
        one_step = api.post(
            f"/api/conversations/{conversation}/messages/",
            json={"content": "y"},
            headers={"Accept": "text/event-stream"},
        )
        assert one_step.status_code == 409 and one_step.json() == follow.json()
        named = {"content": "y", "parent_id": answer}
        assert_error(api.post(f"/api/conversations/{conversation}/messages/", json=named), 409)

        # "stop" ends the branch only for a request that is then carried out: each of
        # these is refused, and the answer streams on.
        stop, bad = {"stop": True}, "invalid_params"
        refused = [
            (f"{answer}/regenerate/", {**stop, "params": {"max_tokens": -1}}, bad),
            (f"{answer}/edit/", {**stop, "content": "x"}, "wrong_role"),
            (f"{question}/regenerate/", stop, "wrong_role"),
            (f"{question}/edit/", {**stop, "content": "x", "params": {"top_p": 7}}, bad),
            (f"{question}/edit/", {**stop, "content": "x", "model": "no-such-model"}, bad),
            (f"{question}/edit/", {**stop, "content": " "}, None),
        ]
        for path, body, code in refused:
            assert_error(api.post(f"/api/messages/{path}", json=body), 400, code)
            assert api.get(f"/api/messages/{answer}/").json()["status"] == "streaming", path
        # "stop" is true or false: a string or a number is refused, not read as either.
        for flag in ("yes", "true", 1, "on", None):
            for path, body in (
                (f"{answer}/regenerate/", {"stop": flag}),
                (f"{question}/edit/", {"stop": flag, "content": "x"}),
            ):
                refused_flag = api.post(f"/api/messages/{path}", json=body)
                assert_error(refused_flag, 400, field="stop")
        assert api.get(f"/api/messages/{answer}/").json()["status"] == "streaming"

        again = created(
            api.post(
                f"/api/messages/{answer}/regenerate/?wait=true",
                json={"stop": True, "params": {"simulation": {"length": 3, "ttft_ms": 0}}},
            )
        )["message"]
        assert again["status"] == "complete"
        assert api.get(f"/api/messages/{answer}/").json()["status"] == "cancelled"
        assert again["siblings"] == [answer, again["id"]]


def test_an_answer_above_being_continued_holds_what_would_follow_it(daphne, account) -> None:
    """A Continue of an answer further up streams into the path of every prompt below it:
    a question after the branch, a regenerate or an edit there would be answered without
    the text the conversation will show above them, so each is refused while it streams."""
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        url = f"/api/conversations/{conversation}/messages/"
        long = {"simulation": {"length": 2000, "tokens_per_second": 20, "ttft_ms": 0}}
        first = created(api.post(url, json={"content": "one", "params": long}))["message"]
        cancelled = api.post(f"/api/messages/{first['id']}/cancel/")
        assert cancelled.json()["status"] == "cancelled", cancelled.text
        short = {"simulation": {"length": 3, "ttft_ms": 0}}
        second = created(api.post(f"{url}?wait=true", json={"content": "two", "params": short}))
        resumed = api.post(f"/api/messages/{first['id']}/continue/")
        assert resumed.json()["status"] == "streaming", resumed.text

        refused = [
            api.post(url, json={"content": "three"}),
            api.post(f"/api/messages/{second['message']['id']}/regenerate/"),
            api.post(f"/api/messages/{second['user_message']['id']}/edit/", json={"content": "2"}),
            api.post(f"/api/messages/{second['message']['id']}/regenerate/", json={"stop": True}),
        ]
        for response in refused:
            assert first["id"] in assert_error(response, 409, "conflict")["message"]
        assert api.get(f"/api/messages/{first['id']}/").json()["status"] == "streaming"
        assert len(branch(api, conversation)) == 4, "nothing was added"

        api.post(f"/api/messages/{first['id']}/cancel/")
        created(api.post(url, json={"content": "three", "params": short}))


def test_an_answer_is_not_continued_while_one_below_it_streams(daphne, account) -> None:
    """The answer below was asked with this one's text as it was: a Continue would change
    the prompt of an answer still being written, so it waits for that answer's end."""
    server = daphne()
    with client(server, account.token) as api:
        conversation = new_conversation(api)
        url = f"/api/conversations/{conversation}/messages/"
        long = {"simulation": {"length": 2000, "tokens_per_second": 20, "ttft_ms": 0}}
        short = {"simulation": {"length": 3, "ttft_ms": 0}}
        first = created(
            api.post(
                f"{url}?wait=true", json={"content": "one", "params": {"max_tokens": 1, **short}}
            )
        )["message"]
        assert first["status"] == "truncated"
        below = created(api.post(url, json={"content": "two", "params": long}))["message"]
        refused = api.post(f"/api/messages/{first['id']}/continue/")
        assert "still streaming" in assert_error(refused, 409, "conflict")["message"]
        assert api.get(f"/api/messages/{below['id']}/").json()["status"] == "streaming"
        assert api.get(f"/api/messages/{first['id']}/").json()["status"] == "truncated"
        api.post(f"/api/messages/{below['id']}/cancel/")
        resumed = api.post(f"/api/messages/{first['id']}/continue/")
        assert resumed.status_code == 202, resumed.text


def test_continue_works_on_an_answer_of_another_branch(three_turns, emulator) -> None:
    api, conversation, turns, _ = three_turns
    old = turns[1]["message"]
    cut = created(
        api.post(
            f"/api/messages/{old['id']}/regenerate/?wait=true",
            json={"params": {"max_tokens": 2}},
        )
    )["message"]
    assert cut["status"] == "truncated"
    api.patch(f"/api/conversations/{conversation}/", json={"current_leaf": old["id"]})
    resumed = api.post(f"/api/messages/{cut['id']}/continue/?wait=true")
    assert resumed.status_code == 200, resumed.text
    assert len(resumed.json()["segments"]) == 2
    # Its prompt is its own path, ending in its own partial text.
    assert prompt_of(emulator, cut["id"], segment=1) == [
        ("user", turns[0]["user_message"]["content"]),
        ("assistant", turns[0]["message"]["content"]),
        ("user", turns[1]["user_message"]["content"]),
        ("assistant", cut["content"]),
    ]
    assert (
        api.get(f"/api/conversations/{conversation}/").json()["current_leaf"]
        == (turns[2]["message"]["id"])
    ), "a Continue does not move the branch shown"
