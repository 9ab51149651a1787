"""The server hooks: write-through on Twisted's TCP server connections and the send-buffer
probe, over a real socket pair; and what happens when a hook cannot work.

The reactor here only records which sockets the connection asks to watch: that request
is exactly what write-through avoids, and what must still happen for bytes the socket
did not take.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import logging
import socket
import sys
import tomllib
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from prometheus_client import REGISTRY
from twisted.internet import tcp
from twisted.internet.protocol import Protocol

from streaming.transports import daphne

ROOT = Path(__file__).resolve().parents[2]


class RecordingReactor:
    def __init__(self) -> None:
        self.writers: set[object] = set()
        self.readers: set[object] = set()

    def addReader(self, fd: object) -> None:  # Twisted names these
        self.readers.add(fd)

    def removeReader(self, fd: object) -> None:
        self.readers.discard(fd)

    def addWriter(self, fd: object) -> None:
        self.writers.add(fd)

    def removeWriter(self, fd: object) -> None:
        self.writers.discard(fd)

    def callLater(self, *args: object) -> None: ...


@pytest.fixture
def pair() -> Iterator[tuple[tcp.Server, socket.socket, RecordingReactor]]:
    assert daphne.install_write_through()
    assert daphne.install_read_holds()
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reactor = RecordingReactor()
    protocol = Protocol()
    connection = tcp.Server(ours, protocol, ("127.0.0.1", 1), None, 1, reactor)
    protocol.makeConnection(connection)
    yield connection, peer, reactor
    ours.close()
    peer.close()


def receive(peer: socket.socket, size: int) -> bytes:
    got = b""
    while len(got) < size:
        chunk = peer.recv(size - len(got))
        assert chunk, "peer closed"
        got += chunk
    return got


def test_a_frame_is_sent_at_once_without_watching_the_socket(pair) -> None:
    connection, peer, reactor = pair
    frame = b"id: 1\nevent: delta\ndata: {}\n\n"
    connection.write(frame)
    connection.writeSequence([b"5\r\n", b"hello", b"\r\n"])
    assert reactor.writers == set()
    expected = frame + b"5\r\nhello\r\n"
    assert receive(peer, len(expected)) == expected


def test_what_the_socket_does_not_take_is_queued_in_order(pair) -> None:
    connection, peer, reactor = pair
    frames = [bytes([65 + i % 26]) * 50_000 for i in range(8)]
    for frame in frames:
        connection.write(frame)
    # The socket took part of the first frame; the rest waits for writability, in order.
    assert reactor.writers == {connection}
    unsent = len(connection.dataBuffer) - connection.offset + connection._tempDataLen
    assert 0 < unsent < sum(map(len, frames))
    expected = b"".join(frames)
    got = b""
    while len(got) < len(expected):
        got += peer.recv(65536)
        connection.doWrite()
    assert got == expected
    assert reactor.writers == set()
    # Drained: the next frame goes straight out again.
    connection.write(b"tail")
    assert reactor.writers == set()
    assert receive(peer, 4) == b"tail"


class Received(Protocol):
    def __init__(self) -> None:
        self.got: list[bytes] = []

    def dataReceived(self, data: bytes) -> None:
        self.got.append(data)


def test_a_connection_is_not_read_while_its_client_leaves_too_much_unread(pair) -> None:
    """A client that sends and does not read what it is sent: once more than the send
    buffer's limit waits for it, the connection is not read (TCP holds the client back),
    and it is read again once the client has taken half of that."""
    connection, peer, reactor = pair
    protocol = Received()
    connection.protocol = protocol
    connection.startReading()  # as Twisted's port does with a connection it accepted
    with override_settings(STREAMING={"SEND_BUFFER_LIMIT": 20_000}):
        connection.write(b"x" * 200_000)
        peer.sendall(b"one frame")
        connection.doRead()
        assert protocol.got == [] and reactor.readers == set()
        connection.doRead()  # a read the reactor had queued still reads nothing
        assert protocol.got == []
        # The protocol's own pause and resume meanwhile leave the hold as it is.
        connection.stopReading()
        connection.startReading()
        assert reactor.readers == set()
        taken = 0
        while daphne._unsent(connection) > 10_000:
            taken += len(peer.recv(65536))
            connection.doWrite()
        assert reactor.readers == {connection}
        connection.doRead()
        assert protocol.got == [b"one frame"]
        # A protocol that paused itself stays paused when the hold ends.
        connection.write(b"x" * 200_000)
        peer.sendall(b"two")
        connection.doRead()
        connection.stopReading()
        while daphne._unsent(connection) > 10_000:
            peer.recv(65536)
            connection.doWrite()
        assert reactor.readers == set()
    assert hook_gauge(daphne.READ_HOLDS) == 1


def test_a_websocket_is_not_read_while_its_frames_wait_for_the_application(pair) -> None:
    connection, _peer, reactor = pair
    connection.startReading()
    queue = daphne.ApplicationQueue()
    queue.transport = connection
    for i in range(daphne.QUEUE_HOLD):
        queue.put_nowait(i)
    assert reactor.readers == set()
    taken = [asyncio.run(queue.get()) for _ in range(daphne.QUEUE_HOLD // 2)]
    assert taken == list(range(daphne.QUEUE_HOLD // 2))
    assert reactor.readers == {connection}


def hook_gauge(hook: str) -> float | None:
    return REGISTRY.get_sample_value("chat_server_hooks_available", {"hook": hook})


def refused_install(install: Callable[[], bool], hook: str, caplog: Any) -> str:
    """``install`` refused (False) and said so on the gauge; the warning's text. The
    hook's warning and gauge are put back after, for the tests that follow."""
    daphne._warned.discard(hook)
    with caplog.at_level(logging.WARNING, logger="streaming.transports.daphne"):
        assert not install()
    assert hook_gauge(hook) == 0
    daphne._warned.discard(hook)
    daphne.metrics.SERVER_HOOKS.labels(hook=hook).set(1)
    return str(caplog.text)


class Channel:
    def __init__(self, transport: object) -> None:
        self.transport = transport


class Request:
    """What Daphne's ``send`` is bound to for HTTP: a twisted.web request with a channel."""

    def __init__(self, transport: object) -> None:
        self.channel = Channel(transport)


def test_the_probe_reads_the_unsent_bytes_behind_daphnes_send(pair) -> None:
    connection, _, _ = pair

    async def handle_reply(protocol: object, message: dict) -> None: ...

    probe = daphne.SendBuffer(functools.partial(handle_reply, Request(connection)))
    assert probe.pending() == 0
    for _ in range(8):
        connection.write(b"x" * 50_000)
    assert 0 < probe.pending() < 400_000
    assert hook_gauge(daphne.SEND_BUFFER) == 1


def test_a_send_without_a_transport_turns_the_bound_off_once_and_says_so(caplog) -> None:
    daphne._warned.discard(daphne.SEND_BUFFER)

    async def plain_send(message: dict) -> None: ...

    with caplog.at_level(logging.WARNING, logger="streaming.transports.daphne"):
        first = daphne.SendBuffer(plain_send)
        second = daphne.SendBuffer(plain_send)
    assert first.pending() is None and second.pending() is None
    warnings = [r for r in caplog.records if "send_buffer unavailable" in r.getMessage()]
    assert len(warnings) == 1
    assert "memory bound is off" in warnings[0].getMessage()
    assert hook_gauge(daphne.SEND_BUFFER) == 0
    assert daphne.check_server()  # a later start-up check on a good server turns it back on
    assert hook_gauge(daphne.SEND_BUFFER) == 1


def test_the_tested_twisted_range_is_the_declared_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (low_major, low_minor), (high_major, _) = daphne.TESTED_TWISTED
    assert f"Twisted>={low_major}.{low_minor},<{high_major}" in project["project"]["dependencies"]


def test_an_untested_twisted_is_reported(monkeypatch, caplog) -> None:
    daphne._warned.clear()
    monkeypatch.setattr(daphne.metadata, "version", lambda name: "99.1.0")
    with caplog.at_level(logging.WARNING, logger="streaming.transports.daphne"):
        assert not daphne.check_server()
    assert "outside the tested range" in caplog.text
    assert hook_gauge(daphne.WRITE_THROUGH) == 0
    daphne._warned.clear()


class DaphneServer:
    """What Daphne's request asks of its server when it is made."""

    def __init__(self) -> None:
        self.connected: list[object] = []

    def protocol_connected(self, protocol: object) -> None:
        self.connected.append(protocol)


@pytest.fixture
def loopback() -> Iterator[tcp.Server]:
    """A Twisted TCP server connection on a real loopback connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    ours, address = listener.accept()
    ours.setblocking(False)
    protocol = Protocol()
    connection = tcp.Server(ours, protocol, address, None, 1, RecordingReactor())
    protocol.makeConnection(connection)
    yield connection
    for sock in (ours, client, listener):
        sock.close()


def test_a_post_body_reaches_the_application_without_twisteds_form_parsing(
    loopback, monkeypatch
) -> None:
    """Twisted parses a form body into ``request.args`` (and every POST's Content-Type)
    unless the hook is on; with it, Daphne's request keeps the raw body untouched."""
    from daphne.http_protocol import WebRequest
    from twisted.web import http

    assert daphne.install_raw_bodies()
    parsed: list[bytes] = []
    real = http._parseContentType
    monkeypatch.setattr(http, "_parseContentType", lambda line: parsed.append(line) or real(line))
    monkeypatch.setattr(WebRequest, "process", lambda self: None)  # the ASGI side: not here
    channel = http.HTTPChannel()
    channel.transport = loopback
    channel.factory = type("Factory", (), {"server": DaphneServer()})()

    def received(factory: type) -> object:
        request = factory(channel)
        form = [b"application/x-www-form-urlencoded"]
        request.requestHeaders.setRawHeaders(b"content-type", form)
        request.gotLength(7)
        request.handleContentChunk(b"a=1&b=2")
        request.requestReceived(b"POST", b"/x", b"HTTP/1.1")
        return request

    plain = received(http.Request)
    assert plain.args == {b"a": [b"1"], b"b": [b"2"]} and parsed, "Twisted parses forms"
    parsed.clear()
    ours = received(WebRequest)
    assert ours.args == {} and parsed == []
    assert ours.content.read() == b"a=1&b=2"
    assert hook_gauge(daphne.RAW_BODIES) == 1


def answer_to(raw: bytes) -> tuple[bytes, dict[str, object], bool]:
    """What Twisted's HTTP channel answers to ``raw``: the status line, the error object,
    and whether it closed the connection."""
    from twisted.internet.testing import StringTransport
    from twisted.web import http

    channel = http.HTTPChannel()
    transport = StringTransport()
    channel.makeConnection(transport)
    channel.dataReceived(raw)
    head, _, body = transport.value().partition(b"\r\n\r\n")
    closing = transport.disconnecting
    channel.connectionLost(None)
    return head.split(b"\r\n")[0], json.loads(body)["error"], closing


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n", 431, "headers_too_large"),
        (
            b"GET / HTTP/1.1\r\n"
            + b"".join(b"X-%d: " % i + b"a" * 4000 + b"\r\n" for i in range(5)),
            431,
            "headers_too_large",
        ),
        (
            b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(600)) + b"\r\n",
            431,
            "too_many_headers",
        ),
        (b"NONSENSE\r\n\r\n", 400, "bad_request"),
        (b"GET / HTTP/1.1\r\n\r\n", 400, "bad_request"),
        (b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 400, "bad_request"),
        (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "bad_request"),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1048577\r\n\r\n", 413, "too_large"),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
            + (b"ffff\r\n" + b"a" * 0xFFFF + b"\r\n") * 17,  # 17 chunks: over 1 MiB
            413,
            "too_large",
        ),
    ],
)
def test_a_request_twisted_refuses_is_told_why(raw: bytes, status: int, code: str) -> None:
    """Twisted's limits stay; its bare 400 (or, for a line over 16 KiB, a silent close)
    becomes a status and the API's error object."""
    assert daphne.install_clear_refusals()
    assert daphne.install_clear_refusals()  # again: nothing changes
    line, error, closing = answer_to(raw)
    assert line.startswith(b"HTTP/1.1 %d " % status)
    assert (error["status"], error["code"]) == (status, code)
    assert error["message"]
    assert closing
    assert hook_gauge(daphne.CLEAR_REFUSALS) == 1


def test_a_request_that_does_not_arrive_whole_in_time_is_told_so() -> None:
    """A client that trickles its request (headers or body, a byte at a time: each byte
    put Twisted's idle clock back) gets a 408 once ``HTTP_REQUEST_TIMEOUT`` has passed
    since its first byte (a request line trickled without its line end too); one that
    arrived whole in time is served."""
    from twisted.internet.task import Clock
    from twisted.internet.testing import StringTransport
    from twisted.web import http

    assert daphne.install_clear_refusals()
    served: list[http.Request] = []

    class Served(http.Request):
        def process(self) -> None:
            served.append(self)

    for raw, late in (
        (b"GET / HTTP/1.1\r\nHost: h\r\nX-Slow: a", True),
        (b"GET /?q=", True),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n{}", True),
        (b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", False),
    ):
        clock, transport, channel = Clock(), StringTransport(), http.HTTPChannel()
        channel.callLater = clock.callLater
        channel.requestFactory = Served
        channel.makeConnection(transport)
        channel.dataReceived(raw)
        clock.advance(59)
        assert not transport.disconnecting
        clock.advance(2)
        if late:
            assert transport.value().startswith(b"HTTP/1.1 408 "), raw
            error = json.loads(transport.value().partition(b"\r\n\r\n")[2])["error"]
            assert (error["code"], error["status"]) == ("request_timeout", 408)
            assert transport.disconnecting
        else:
            assert served and not transport.disconnecting
        channel.connectionLost(None)


def openai_fields(error: dict[str, object]) -> tuple[object, object] | None:
    """OpenAI's ``type`` and ``param`` of an error object, None when it has neither."""
    if "type" not in error and "param" not in error:
        return None
    return error.get("type"), error.get("param")


V1_BIG = b"X-Big: " + b"a" * 20_000 + b"\r\n"


V1_REFUSALS = [
    (b"GET /v1/models HTTP/1.1\r\n" + V1_BIG + b"\r\n", 431, True),
    (
        b"GET /v1/models HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(600)) + b"\r\n",
        431,
        True,
    ),
    (
        b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 1048577\r\n\r\n",
        413,
        True,
    ),
    (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        + (b"ffff\r\n" + b"a" * 0xFFFF + b"\r\n") * 17,
        413,
        True,
    ),
    (b"GET /v1/models HTTP/1.1\r\nHost: h\r\nX-A: a\rb\r\n\r\n", 400, True),
    (b"GET /v1/models HTTP/1.1\r\n\r\n", 400, True),
    (
        b"POST http://h:8000/v1/chat/completions HTTP/1.1\r\nHost: h\r\n"
        b"Content-Length: 1048577\r\n\r\n",
        413,
        True,
    ),
    # Not under /v1/: our shape alone.
    (b"GET /api/conversations/ HTTP/1.1\r\n" + V1_BIG + b"\r\n", 431, False),
    (b"GET /v1 HTTP/1.1\r\n" + V1_BIG + b"\r\n", 431, False),
    (b"GET http://h/v1x/ HTTP/1.1\r\n" + V1_BIG + b"\r\n", 431, False),
    # No request line read: no path to go by.
    (b"GET /v1/models?" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n", 431, False),
    (b"GET /v1/models HTTP/1.1 x\r\n\r\n", 400, False),
]


def test_a_refusal_of_a_v1_request_is_in_openais_error_shape() -> None:
    """Every answer under ``/v1/`` carries OpenAI's ``type`` and ``param``; the server's
    own refusals did not. Elsewhere, and for a refusal made before the request line is
    read, the object is ours alone."""
    assert daphne.install_clear_refusals()
    for raw, status, openai in V1_REFUSALS:
        line, error, closing = answer_to(raw)
        assert line.startswith(b"HTTP/1.1 %d " % status) and error["status"] == status, raw
        expected = ("invalid_request_error", None) if openai else None
        assert openai_fields(error) == expected, raw[:60]
        assert closing


def test_a_v1_request_that_does_not_arrive_whole_in_time_is_told_in_openais_shape() -> None:
    from twisted.internet.task import Clock
    from twisted.internet.testing import StringTransport
    from twisted.web import http

    assert daphne.install_clear_refusals()
    for path, openai in ((b"/v1/models", True), (b"/api/conversations/", False)):
        clock, transport, channel = Clock(), StringTransport(), http.HTTPChannel()
        channel.callLater = clock.callLater
        channel.makeConnection(transport)
        channel.dataReceived(b"GET " + path + b" HTTP/1.1\r\nHost: h\r\nX-Slow: a")
        clock.advance(61)
        assert transport.value().startswith(b"HTTP/1.1 408 ")
        error = json.loads(transport.value().partition(b"\r\n\r\n")[2])["error"]
        assert error["code"] == "request_timeout"
        assert openai_fields(error) == (("invalid_request_error", None) if openai else None)
        channel.connectionLost(None)


@pytest.mark.parametrize(
    ("target", "path"),
    [
        (b"/v1/models?a=1", "/v1/models"),
        (b"http://h:80/v1/models?a=1", "/v1/models"),
        (b"HTTPS://h", "/"),
        (b"http://h?a=/v1/", "/"),
        (b"*", "*"),
        (None, ""),
    ],
)
def test_the_path_a_request_target_names(target: bytes | None, path: str) -> None:
    assert daphne.target_path(target) == path


class ApplicationQueue(list):
    def put_nowait(self, message: object) -> None:
        self.append(message)


class DaphneApplicationServer(DaphneServer):
    """What Daphne's request asks of its server to hand a request to the application:
    the scopes it was asked to make applications for."""

    server_name = "daphne"
    root_path = ""
    request_buffer_size = 8192
    proxy_forwarded_address_header = None

    def __init__(self) -> None:
        super().__init__()
        self.scopes: list[dict[str, object]] = []

    def create_application(self, protocol: object, scope: dict[str, object]) -> ApplicationQueue:
        self.scopes.append(scope)
        return ApplicationQueue()

    def protocol_disconnected(self, protocol: object) -> None: ...

    def log_action(self, *args: object) -> None: ...


def daphne_answer(raw: bytes) -> tuple[bytes, bytes, DaphneApplicationServer, object]:
    """The head and body Daphne's request over Twisted's channel answers ``raw`` with, the
    server that saw it and the channel's transport."""
    from daphne.http_protocol import WebRequest
    from twisted.internet.testing import StringTransport
    from twisted.web import http

    server = DaphneApplicationServer()
    channel = http.HTTPChannel()
    channel.requestFactory = WebRequest
    channel.factory = type("Factory", (), {"server": server, "log": lambda self, r: None})()
    transport = StringTransport()
    channel.makeConnection(transport)
    channel.dataReceived(raw)
    head, _, body = transport.value().partition(b"\r\n\r\n")
    return head, body, server, transport


@pytest.mark.parametrize(
    ("header", "openai"),
    [
        (b"X-A: a\x0bb", False),
        (b"X-A: \x85", False),
        (b"X-A: a\x1cb", True),
    ],
)
def test_a_header_value_daphne_refuses_is_told_in_the_error_shape(
    header: bytes, openai: bool
) -> None:
    """Daphne refuses a header value with a control character Twisted lets through: with
    an HTML page, where every other refusal is the error object."""
    assert daphne.install_json_errors()
    assert daphne.install_json_errors()  # again: nothing changes
    path = b"/v1/models" if openai else b"/api/conversations/"
    head, body, server, transport = daphne_answer(
        b"GET " + path + b" HTTP/1.1\r\nHost: h\r\n" + header + b"\r\n\r\n"
    )
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert b"\r\nContent-Type: application/json\r\n" in head
    assert b"\r\nConnection: close\r\n" in head
    error = json.loads(body)["error"]
    assert (error["status"], error["code"]) == (400, "bad_request")
    assert "RFC 9110" in error["message"]
    assert openai_fields(error) == (("invalid_request_error", None) if openai else None)
    assert server.scopes == [], "the application never saw it"
    assert transport.disconnecting
    assert hook_gauge(daphne.JSON_ERRORS) == 1


def test_an_application_that_fails_before_answering_gets_the_error_object() -> None:
    """Daphne's 500 for an application's exception is the error object too; the
    connection stays open for the next request, as Daphne keeps it."""
    assert daphne.install_json_errors()
    for path, openai in ((b"/v1/models", True), (b"/api/conversations/", False)):
        head, body, server, transport = daphne_answer(
            b"GET " + path + b" HTTP/1.1\r\nHost: h\r\n\r\n"
        )
        assert (head, body) == (b"", b"") and len(server.scopes) == 1
        (request,) = server.connected
        request.handle_exception(RuntimeError("the application failed"))
        head, _, body = transport.value().partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 500 "), head
        error = json.loads(body)["error"]
        assert (error["code"], error["message"]) == ("server_error", "internal server error")
        assert openai_fields(error) == (("server_error", None) if openai else None)
        assert b"Connection: close" not in head and not transport.disconnecting


def test_a_daphne_whose_error_page_changed_shape_keeps_it(monkeypatch, caplog) -> None:
    from daphne.http_protocol import WebRequest

    def basic_error(self: object, status: int, body: str) -> None: ...

    monkeypatch.setattr(WebRequest, "basic_error", basic_error)
    said = refused_install(daphne.install_json_errors, daphne.JSON_ERRORS, caplog)
    assert WebRequest.basic_error is basic_error
    assert "WebRequest.basic_error changed shape" in said


ABSOLUTE_TARGETS = [
    (b"http://Example.test:8000/api/x/?a=1", "/api/x/", b"a=1", b"Example.test:8000"),
    (b"HTTPS://[::1]:8443/v1/models", "/v1/models", b"", b"[::1]:8443"),
    (b"http://example.test?a=1", "/", b"a=1", b"example.test"),
    (b"http://example.test", "/", b"", b"example.test"),
    (b"/api/x/?a=1", "/api/x/", b"a=1", b"other.test"),  # origin-form: as it came
]


def test_an_absolute_form_target_is_served_by_its_path_for_its_host() -> None:
    """RFC 9112 section 3.2.2: the target's authority is the request's host, whatever
    its ``Host`` says; Daphne passed the whole URL on as the path."""
    assert daphne.install_absolute_targets()
    assert daphne.install_absolute_targets()  # again: nothing changes
    for target, path, query, host in ABSOLUTE_TARGETS:
        _head, _body, server, _transport = daphne_answer(
            b"GET " + target + b" HTTP/1.1\r\nHost: other.test\r\nX-A: 1\r\n\r\n"
        )
        (scope,) = server.scopes
        seen = (scope["path"], scope["raw_path"], scope["query_string"], scope["headers"])
        assert seen == (path, path.encode(), query, [(b"host", host), (b"x-a", b"1")]), target
    assert hook_gauge(daphne.ABSOLUTE_TARGETS) == 1


@pytest.mark.parametrize(
    ("target", "why"),
    [
        (b"http:///v1/models", "no host"),
        (b"http://user:secret@example.test/v1/models", "user information"),
    ],
)
def test_an_absolute_form_target_without_a_host_or_with_user_information_is_refused(
    target: bytes, why: str
) -> None:
    """RFC 9110 sections 4.2.1 and 4.2.4: an http URI with an empty host is invalid, and
    one with user information is an error (a host that is not the host)."""
    assert daphne.install_absolute_targets()
    head, body, server, transport = daphne_answer(
        b"GET " + target + b" HTTP/1.1\r\nHost: example.test\r\n\r\n"
    )
    assert head.startswith(b"HTTP/1.1 400 ") and b"\r\nConnection: close\r\n" in head
    error = json.loads(body)["error"]
    assert (error["code"], error["message"]) == (
        "bad_request",
        f"the request's target names {why}",
    )
    assert openai_fields(error) == ("invalid_request_error", None)
    assert server.scopes == [] and transport.disconnecting


def test_a_request_behind_unread_responses_closes_the_connection() -> None:
    """A request arriving while more than the send buffer's limit of the responses
    before it wait to be read (a client that pipelines and reads nothing) is not
    served: the connection closes once those are sent."""
    from twisted.internet.testing import StringTransport
    from twisted.web import http

    assert daphne.install_clear_refusals()
    transport = StringTransport()
    transport.dataBuffer, transport.offset, transport._tempDataLen = b"x" * 100_000, 0, 0
    channel = http.HTTPChannel()
    channel.makeConnection(transport)
    served: list[http.Request] = []

    class Served(http.Request):
        def process(self) -> None:
            served.append(self)

    channel.requestFactory = Served
    with override_settings(STREAMING={"SEND_BUFFER_LIMIT": 65_536}):
        channel.dataReceived(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    assert served == [] and transport.value() == b"" and transport.disconnecting
    channel.connectionLost(None)


def test_daphne_replies_through_twisteds_http_module_not_its_deprecation_proxy() -> None:
    from twisted.python import deprecate
    from twisted.web import http

    assert isinstance(http, deprecate._ModuleProxy), "what the hook goes around"
    assert daphne.install_plain_http()
    assert daphne.install_plain_http()  # again: nothing changes
    for name in daphne.DAPHNE_HTTP_USERS:  # ``import daphne`` would shadow the module here
        module = importlib.import_module(name)
        assert type(module.http) is types.ModuleType
        assert module.http.Request is http.Request
    assert type(sys.modules["twisted.web.http"]) is deprecate._ModuleProxy  # for the rest
    assert hook_gauge(daphne.PLAIN_HTTP) == 1


def test_autobahns_debug_log_fields_are_made_only_when_a_line_is_written(monkeypatch) -> None:
    import pprint

    from autobahn import util
    from autobahn.twisted import websocket as twisted_websocket
    from autobahn.websocket import protocol
    from twisted.logger import formatEvent

    assert daphne.install_lazy_log_fields()
    assert daphne.install_lazy_log_fields()  # again: nothing changes
    made: list[object] = []
    monkeypatch.setattr(util, "hl", lambda text, **style: made.append(text) or f"[{text}]")
    real_pformat = pprint.pformat
    monkeypatch.setattr(pprint, "pformat", lambda value: made.append(value) or real_pformat(value))
    settings = [("autoPingInterval", 0, "WebSocketServerFactory")]
    for module in (protocol, twisted_websocket):
        fields = {
            "func": module.hltype(protocol.WebSocketProtocol.sendData),
            "peer": module.hlval("tcp:127.0.0.1:5555"),
            "data_len": module.hlval(42, color="green"),
        }
        if module is protocol:
            fields["attrs"] = module.pformat(settings)
        assert made == [], "nothing is made for a line no one writes"
        line = formatEvent({"log_format": " ".join(f"{{{k}}}" for k in fields), **fields})
        expected = [
            util.hltype(protocol.WebSocketProtocol.sendData),
            util.hlval("tcp:127.0.0.1:5555"),
            util.hlval(42, color="green"),
        ]
        if module is protocol:
            expected.append(real_pformat(settings))
        assert line == " ".join(expected), "a written line reads as autobahn's own"
        made.clear()
    timings = protocol.Timings()
    timings.track("sendMessage")
    assert str(timings) == real_pformat(timings._timings), "Timings' text is still text"
    assert hook_gauge(daphne.LAZY_LOG_FIELDS) == 1


def test_a_frame_for_a_closing_websocket_is_dropped_not_an_error() -> None:
    from autobahn.exception import Disconnected
    from daphne.ws_protocol import WebSocketProtocol

    original = WebSocketProtocol.serverSend
    socket_ = WebSocketProtocol()
    socket_.client_addr = ["127.0.0.1", 5555]
    socket_.state = WebSocketProtocol.STATE_CLOSING
    if not getattr(WebSocketProtocol, "closing_sends", False):
        with pytest.raises(Disconnected):  # what autobahn does without the hook
            original(socket_, "late frame")
    assert daphne.install_closing_sends()
    assert daphne.install_closing_sends()  # again: nothing changes
    for state in (WebSocketProtocol.STATE_CLOSING, WebSocketProtocol.STATE_CLOSED):
        socket_.state = state
        socket_.serverSend("late frame")  # dropped: the client asked for no more
        socket_.serverSend(b"late frame", True)
    sent: list[tuple[bytes, bool]] = []
    socket_.sendMessage = lambda payload, binary=False: sent.append((payload, binary))
    socket_.state = WebSocketProtocol.STATE_OPEN
    socket_.serverSend("frame")
    assert sent == [(b"frame", False)], "an open socket's frames go to autobahn as before"
    assert hook_gauge(daphne.CLOSING_SENDS) == 1


def test_daphne_queues_a_connections_messages_in_an_application_queue() -> None:
    from daphne import server

    assert daphne.install_application_queues()
    assert daphne.install_application_queues()  # again: nothing changes
    seen = server.asyncio
    assert seen.Queue is daphne.ApplicationQueue
    assert seen.ensure_future is asyncio.ensure_future, "everything else is asyncio's own"
    assert hook_gauge(daphne.APPLICATION_QUEUES) == 1


async def test_an_application_queue_hands_each_message_to_one_get_in_order() -> None:
    queue = daphne.ApplicationQueue()
    queue.put_nowait("body")
    queue.put_nowait("disconnect")
    assert await queue.get() == "body"
    assert await queue.get() == "disconnect"
    first = asyncio.ensure_future(queue.get())
    second = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)  # both wait
    assert not first.done() and not second.done()
    queue.put_nowait(1)
    queue.put_nowait(2)
    assert await first == 1
    assert await second == 2


async def test_a_get_cancelled_after_its_wake_up_leaves_the_message_to_the_next() -> None:
    queue = daphne.ApplicationQueue()
    woken = asyncio.ensure_future(queue.get())
    other = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)
    queue.put_nowait("message")  # wakes `woken`, which has not run yet
    woken.cancel()
    with pytest.raises(asyncio.CancelledError):
        await woken
    assert await asyncio.wait_for(other, 5) == "message", "the wake-up was passed on"
    cancelled = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    queue.put_nowait("later")
    assert await queue.get() == "later", "a cancelled wait takes nothing"


def test_a_daphne_that_uses_more_of_its_queue_keeps_asyncios(monkeypatch, caplog) -> None:
    from daphne import server, ws_protocol

    monkeypatch.setattr(server, "asyncio", asyncio)
    source = "self.application_queue.put_nowait(x)\nself.application_queue.qsize()\n"
    real_source = daphne.inspect.getsource
    monkeypatch.setattr(
        daphne.inspect,
        "getsource",
        lambda m: source if m is ws_protocol else real_source(m),
    )
    said = refused_install(daphne.install_application_queues, daphne.APPLICATION_QUEUES, caplog)
    assert server.asyncio is asyncio
    assert "qsize" in said
