"""PostgreSQL unreachable for a few seconds in the middle of a stream.

Tokens keep flowing to the reader while the database is gone (they travel through the
event log, never the database); the write-behind flush and the final record retry, so
the stored message catches up and matches what the reader got.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from urllib.parse import urlsplit

import httpx
import pytest

from tests.faults.readers import Reader, answer_being_read, assert_exact
from tests.support.clients import auth, create_conversation, post_message, read_sse
from tests.support.servers import database_url

pytestmark = [pytest.mark.asyncio, pytest.mark.postgres]

OUTAGE_SECONDS = 3.0  # how long the database stays unreachable: the fault itself


def through(proxy_port: int) -> str:
    url = database_url()
    host_port = url.split("@", 1)[1].split("/", 1)[0]
    return url.replace(f"@{host_port}/", f"@127.0.0.1:{proxy_port}/")


async def test_database_outage_mid_stream_loses_nothing(postgres_proxy, daphne, account):
    server = daphne(DATABASE_URL=through(postgres_proxy.port), STREAM_FLUSH_INTERVAL="0.2")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        simulation = {"length": 400, "tokens_per_second": 60, "ttft_ms": 0}
        message, reader, task = await answer_being_read(
            client, client, account.token, simulation, seen=10
        )
        postgres_proxy.cut()
        at_cut = reader.deltas
        await asyncio.sleep(OUTAGE_SECONDS)
        during = reader.deltas - at_cut
        postgres_proxy.restore()
        async with asyncio.timeout(60):
            await task
        assert during > 0, "tokens kept flowing while the database was unreachable"
        assert reader.reconnects == 0
        stored = await client.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        persisted = stored.json()
        assert persisted["status"] == "complete", persisted["termination"]
        assert_exact(reader.events, persisted)
        assert len(persisted["content"]) > 0
        assert (await client.get("/readyz")).status_code == 200


async def test_a_stream_opened_while_the_database_is_away_gets_the_json_error(
    postgres_proxy, daphne, account
):
    """Unless the answer streams in the process asked: its owner follows it from the log
    then, as a reader already connected does (with a token the process holds)."""
    # A lookup waits for a connection the pool cannot make while the database is away.
    server = daphne(
        DATABASE_URL=through(postgres_proxy.port),
        STREAM_TOKEN_CACHE_SECONDS="30",
        DATABASE_POOL_TIMEOUT="2",
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        conversation = await create_conversation(client, account.token)
        ended = await post_message(client, account.token, conversation, "hi")
        assert (await read_sse(client, account.token, ended["id"])).events[-1].event == "done"
        live = await post_message(
            client, account.token, conversation, "more",
            simulation={"length": 400, "tokens_per_second": 20, "ttft_ms": 0},
        )  # fmt: skip
        postgres_proxy.cut()
        try:
            response = await client.get(
                f"/api/messages/{ended['id']}/stream/", headers=auth(account.token)
            )
            followed = await read_sse(client, account.token, live["id"], after=1, stop_after=3)
        finally:
            postgres_proxy.restore()
        assert response.status_code == 503
        assert response.headers["content-type"] == "application/json"
        assert response.json()["error"]["code"] == "unavailable"
        assert int(response.headers["retry-after"]) > 0
        assert followed.status == 200
        # Deltas after the cursor, in order (a run already logged comes merged in one).
        seqs = [e.data["seq"] for e in followed.events]
        assert len(seqs) == 3 and 1 < seqs[0] < seqs[1] < seqs[2]


async def test_connections_the_server_ended_fail_no_request(daphne, account):
    """Every connection of the database's is ended by the server (``pg_terminate_backend``,
    as a restart or a proxy's idle timeout would) while the process holds them, in its
    pool and in its database threads: the requests after it are served on new ones,
    where each held connection used to fail one request with a 500."""
    from asgiref.sync import sync_to_async
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (DATABASE_URL)")

    def backends() -> set[int]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            return {pid for (pid,) in cursor.fetchall()}

    ours = await sync_to_async(backends)()  # the test's own, which must live on
    server = daphne()
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        quick = {"simulation": {"length": 3, "ttft_ms": 0, "tokens_per_second": 1000}}

        async def requests() -> list[httpx.Response]:
            conversation = await create_conversation(client, account.token)
            url = f"/api/conversations/{conversation}/messages/?wait=true"
            made = [
                await client.post(
                    url, json={"content": "hi", "params": quick}, headers=auth(account.token)
                )
                for _ in range(4)
            ]
            listed = [
                await client.get("/api/conversations/", headers=auth(account.token))
                for _ in range(4)
            ]
            return [*made, *listed, await client.get("/readyz")]

        assert all(r.status_code in (200, 201) for r in await requests())

        def end_the_servers_connections() -> set[int]:
            with connection.cursor() as cursor:
                theirs = backends() - ours - {connection.connection.info.backend_pid}
                for pid in theirs:
                    # With a timeout it returns once the backend is gone, not just told.
                    cursor.execute("SELECT pg_terminate_backend(%s, 10000)", [pid])
                return theirs

        assert await sync_to_async(end_the_servers_connections)()
        answers = await requests()
        assert [r.status_code for r in answers] == [201] * 4 + [200] * 5, [
            r.text for r in answers if r.status_code >= 400
        ]


# How PostgreSQL goes away: ``refused``, its connections reset and new ones refused (a host
# gone); ``frozen``, its connections kept open and new ones accepted, with nothing answered
# on any (a proxy or pooler that stopped, a host that hangs).
FAULTS = {"refused": ("cut", "restore"), "frozen": ("freeze", "thaw")}


@pytest.mark.parametrize("fault", FAULTS)
async def test_requests_while_the_database_is_away_are_503s_to_retry(
    postgres_proxy, daphne, account, fault
):
    """REST, the one-step post, /v1 and a WebSocket create, with PostgreSQL away: each
    is told the database is unavailable and to retry (503 ``unavailable`` with
    ``Retry-After``; the frame's error), within the pool's wait or the wait for an answer
    (``DATABASE_WAIT_TIMEOUT``), not a 500 and not a request held until TCP gives up;
    and each works again once the database is back."""
    from tests.support.wsclient import ChatSocket

    away, back = (getattr(postgres_proxy, name) for name in FAULTS[fault])
    server = daphne(
        DATABASE_URL=f"{through(postgres_proxy.port)}?connect_timeout=2",
        DATABASE_POOL_TIMEOUT="2",
        DATABASE_WAIT_TIMEOUT="2",
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        conversation = await create_conversation(client, account.token)
        bearer = {"Authorization": f"Bearer {account.token}"}
        v1 = {"model": "simulated", "messages": [{"role": "user", "content": "hi"}]}
        url = f"/api/conversations/{conversation}/messages/"
        stream = {**auth(account.token), "Accept": "text/event-stream"}
        socket = await ChatSocket.connect(server.ws_url, account.token)
        try:
            away()
            try:
                refused = [
                    await client.get("/api/conversations/", headers=auth(account.token)),
                    await client.post("/api/conversations/", json={}, headers=auth(account.token)),
                    await client.post(url, json={"content": "hi"}, headers=stream),
                    await client.post("/v1/chat/completions", json=v1, headers=bearer),
                ]
                await socket.send({"type": "message.create", "content": "hi", "ref": 1})
                frame = (await socket.recv_until("error"))[-1]
            finally:
                back()
            for response in refused:
                assert response.status_code == 503, (response.request.url, response.text)
                assert response.json()["error"]["code"] == "unavailable"
                assert int(response.headers["retry-after"]) > 0
            assert (frame["type"], frame["code"], frame["status"]) == ("error", "unavailable", 503)
            async with asyncio.timeout(30):  # as a client told to retry does
                while True:
                    listed = await client.get("/api/conversations/", headers=auth(account.token))
                    if listed.status_code != 503:
                        break
                    await asyncio.sleep(int(listed.headers["retry-after"]))
            assert listed.status_code == 200, listed.text
        finally:
            await socket.close()


async def test_a_final_record_whose_answer_never_came_still_ends_the_stream(
    postgres_proxy, daphne, account
):
    """The answer's final record reaches PostgreSQL and commits, but the reply is lost (a
    network that drops what the server sends): the server gives up on it after
    ``DATABASE_WAIT_TIMEOUT`` and tries again once PostgreSQL answers. The try finds the
    segment final with its own record (``ended_at`` names the write), so it still ends the
    log with the segment's ``done``: the reader gets it, and what it got is what is stored.
    Before, the try counted the record as someone else's and nobody sent the ``done``: the
    reader waited for ever. So it did when the database stayed silent for longer than the
    final record is retried (``STREAM_PERSIST_RETRY_SECONDS``, shorter here than the wait
    for the lost answer): while the database cannot be reached, tries go on."""
    from asgiref.sync import sync_to_async

    from streaming.models import Segment
    from streaming.termination import Status

    server = daphne(
        DATABASE_URL=f"{through(postgres_proxy.port)}?connect_timeout=2",
        DATABASE_POOL_TIMEOUT="2",
        DATABASE_WAIT_TIMEOUT="2",
        STREAM_PERSIST_RETRY_SECONDS="1",
    )
    tokens = 30
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        conversation = await create_conversation(client, account.token)
        message = await post_message(
            client, account.token, conversation, "hi",
            simulation={"length": tokens, "tokens_per_second": 20, "ttft_ms": 0},
        )  # fmt: skip
        reader = Reader(client, account.token, message["id"])
        task = asyncio.create_task(reader.run())

        def final() -> bool:
            segment = Segment.objects.get(message_id=message["id"], index=0)
            return segment.status != Status.STREAMING

        try:
            async with asyncio.timeout(30):
                await reader.seen(1).wait()
            # From the final record's statement on, nothing PostgreSQL sends arrives.
            postgres_proxy.hold_replies(after=b'UPDATE "streaming_segment"')
            # The server gives up on the record's answer and closes the connection.
            assert await asyncio.to_thread(postgres_proxy.given_up.wait, 60)
            assert await sync_to_async(final)(), "the record committed all the same"
            assert not task.done(), "the done waits for the record's answer"
        finally:
            postgres_proxy.thaw()
        async with asyncio.timeout(60):
            await task
        assert reader.events[-1]["type"] == "done"
        stored = await client.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        persisted = stored.json()
        assert persisted["status"] == "complete", persisted["termination"]
        assert_exact(reader.events, persisted)


async def test_an_answer_whose_post_failed_after_its_commit_is_ended(
    postgres_proxy, daphne, account
):
    """A post's rows commit, but the answer to its ``COMMIT`` is lost: the post fails
    (``503 unavailable``) and no generation starts, leaving an answer ``streaming`` in a
    process that lives on, so the pass for dead processes never finds it. The reaper's
    pass for this process's own segments ends it ``interrupted`` (two passes after),
    which gives its owner's slot back: with one slot, the next post used to be a 429 for
    ever."""
    server = daphne(
        DATABASE_URL=f"{through(postgres_proxy.port)}?connect_timeout=2",
        DATABASE_POOL_TIMEOUT="2",
        DATABASE_WAIT_TIMEOUT="2",
        MAX_CONCURRENT_GENERATIONS_PER_USER="1",
        STREAM_HEARTBEAT_TIMEOUT="1",
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        conversation = await create_conversation(client, account.token)
        url = f"/api/conversations/{conversation}/messages/"
        # The post's writes and its COMMIT go out together; nothing the server says after
        # them arrives.
        postgres_proxy.hold_replies(after=b'INSERT INTO "streaming_segment"')
        try:
            failed = await client.post(url, json={"content": "hi"}, headers=auth(account.token))
            assert await asyncio.to_thread(postgres_proxy.given_up.wait, 60)
        finally:
            postgres_proxy.thaw()
        assert failed.status_code == 503, failed.text
        assert failed.json()["error"]["code"] == "unavailable"
        listed = await client.get(url, headers=auth(account.token))
        answers = [m for m in listed.json()["results"] if m["role"] == "assistant"]
        assert [m["status"] for m in answers] == ["streaming"], "the rows committed"
        async with asyncio.timeout(60):  # reaper passes every half second here
            while True:
                stray = await client.get(
                    f"/api/messages/{answers[0]['id']}/", headers=auth(account.token)
                )
                if stray.json()["status"] != "streaming":
                    break
                await asyncio.sleep(0.2)
        assert stray.json()["status"] == "interrupted", stray.json()
        assert stray.json()["termination"]["error_message"].startswith("this answer never started")
        followed = await read_sse(client, account.token, answers[0]["id"])
        assert followed.events[-1].event == "done"
        again = await client.post(url, json={"content": "again"}, headers=auth(account.token))
        assert again.status_code == 201, again.text


async def test_a_post_waiting_on_a_lock_leaves_no_backend_behind(daphne, account):
    """Another session holds the conversation's row lock for longer than a call may wait:
    the post is a 503 to retry, and PostgreSQL itself stopped waiting for it (its
    ``statement_timeout``, just under ``DATABASE_WAIT_TIMEOUT``). The server used to go
    on waiting on the lock after the client gave up, one backend more for every try."""
    import psycopg
    from asgiref.sync import sync_to_async
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (DATABASE_URL)")
    server = daphne(DATABASE_WAIT_TIMEOUT="2")
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        conversation = await create_conversation(client, account.token)
        url = f"/api/conversations/{conversation}/messages/"
        holder = await psycopg.AsyncConnection.connect(database_url())
        try:
            await holder.execute(
                "SELECT 1 FROM streaming_conversation WHERE id = %s FOR UPDATE", [conversation]
            )
            refused = [
                await client.post(url, json={"content": "hi"}, headers=auth(account.token))
                for _ in range(3)
            ]

            def waiting_on_locks() -> int:
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND wait_event_type = 'Lock'"
                    )
                    return cursor.fetchone()[0]

            waiting = await sync_to_async(waiting_on_locks)()
        finally:
            await holder.rollback()
            await holder.close()
        for response in refused:
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "unavailable"
        assert waiting == 0, "no backend still waits on the lock for a call given up"
        made = await client.post(url, json={"content": "hi"}, headers=auth(account.token))
        assert made.status_code == 201, made.text


# A stopping process's drain at most (``STREAM_SHUTDOWN_DEADLINE`` 1 s, ``INTERRUPT_WAIT``,
# the readers' flush, the heartbeat key's delete, the database threads' release: 12 s),
# with room for a loaded machine; a database call waits far longer (``STOPPING_POOL_WAIT``).
STOP_SECONDS = 30.0
STOPPING_POOL_WAIT = 300
HEARTBEAT_TIMEOUT = 2.0


def redis_through(proxy_port: int) -> str:
    url = urlsplit(os.environ["REDIS_URL"])
    return url._replace(netloc=f"{url.hostname}:{proxy_port}").geturl()


@pytest.mark.usefixtures("needs_redis")
@pytest.mark.parametrize("unreachable", ["postgres", "postgres and redis"])
async def test_a_process_stopping_without_its_database_leaves_its_answer_to_a_reaper(
    postgres_proxy, redis_proxy, daphne, account, unreachable
):
    """SIGTERM to the process generating an answer while it cannot reach PostgreSQL (nor,
    in the second case, Redis, so it cannot delete its heartbeat key): the drain interrupts
    the answer, its record cannot be written, and the process stops within its drain's
    own bounds, its heartbeat key gone, although every database call it makes waits far
    longer. Another process's reaper then ends the answer ``interrupted`` with exactly the
    text its reader saw, within its documented time (2.5 heartbeat timeouts).

    The process used to wait for its database calls in progress (and for the final
    record's retries, started afresh until the database was back) and beat on meanwhile,
    so no reaper took its answer over until the database was back."""
    import redis.asyncio as aioredis
    from asgiref.sync import sync_to_async

    from streaming.models import Segment
    from streaming.presence.redis import worker_key

    env = {
        "STREAM_SHUTDOWN_DEADLINE": "1",
        "STREAM_HEARTBEAT_INTERVAL": "0.5",
        "STREAM_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
    }
    a = daphne(
        "a",
        DATABASE_URL=through(postgres_proxy.port),
        DATABASE_POOL_TIMEOUT=str(STOPPING_POOL_WAIT),
        REDIS_URL=redis_through(redis_proxy.port),
        **env,
    )
    b = daphne("b", **env)  # PostgreSQL and Redis without a proxy: never cut
    redis = aioredis.from_url(os.environ["REDIS_URL"])
    async with (
        httpx.AsyncClient(base_url=a.url, timeout=30) as ca,
        httpx.AsyncClient(base_url=b.url, timeout=30) as cb,
    ):
        conversation = await create_conversation(ca, account.token)
        message = await post_message(
            ca, account.token, conversation, "hi",
            simulation={"length": 5000, "tokens_per_second": 20, "ttft_ms": 0},
        )  # fmt: skip
        segment = await sync_to_async(Segment.objects.get)(message_id=message["id"], index=0)
        heartbeat = worker_key(segment.worker)
        reader = Reader(cb, account.token, message["id"])
        task = asyncio.create_task(reader.run())
        try:
            async with asyncio.timeout(30):
                await reader.seen(5).wait()
            assert await redis.exists(heartbeat), "the generating process beats"
            postgres_proxy.cut()
            if unreachable == "postgres and redis":
                redis_proxy.cut()
            assert a.proc is not None
            a.proc.send_signal(signal.SIGTERM)
            try:
                code = await asyncio.to_thread(a.proc.wait, STOP_SECONDS)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running {STOP_SECONDS:g} s after SIGTERM")
            assert code == 0
            assert not await redis.exists(heartbeat), "its heartbeat key is gone"
            async with asyncio.timeout(2.5 * HEARTBEAT_TIMEOUT + 15):
                await task
            assert not await redis.exists(heartbeat), "and no beat put it back"
        finally:
            task.cancel()
            await redis.aclose()
        stored = await cb.get(f"/api/messages/{message['id']}/", headers=auth(account.token))
        persisted = stored.json()
    assert "stopping with answers not ended (1)" in a.log_text()
    assert persisted["status"] == "interrupted", persisted["termination"]
    assert reader.events[-1]["status"] == "interrupted"
    assert_exact(reader.events, persisted)
    assert persisted["content"], "the text its reader saw is kept"
