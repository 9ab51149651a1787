"""Fault fixtures: a private Redis server that a test may kill and restart, and a TCP
proxy in front of PostgreSQL that a test may cut and restore.

Both are real processes/sockets on loopback; neither touches the shared services the
rest of the suite uses.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.tcpproxy import TcpProxy

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 10.0
POLL_INTERVAL = 0.02


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrivateRedis:
    """``redis-server`` on its own port, without persistence: a restart loses every key,
    as a crashed cache node would."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = ROOT / "test-artifacts" / "logs" / f"redis-{port}.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    "redis-server",
                    "--port", str(self.port),
                    "--bind", "127.0.0.1",
                    "--save", "",
                    "--appendonly", "no",
                    "--daemonize", "no",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        # Polling: readiness is another process's state and Redis offers nothing to await.
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, "redis-server exited"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(POLL_INTERVAL)
        raise TimeoutError(f"redis-server on port {self.port} did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("needs the redis-server binary for a private, restartable Redis")
    server = PrivateRedis(free_port()).start()
    yield server
    server.stop()


@pytest.fixture
def postgres_proxy(transactional_db: None) -> Iterator[TcpProxy]:
    """A proxy in front of the test database's PostgreSQL server (skips on SQLite)."""
    from django.db import connection

    settings = connection.settings_dict
    if not settings["ENGINE"].endswith("postgresql"):
        pytest.skip("needs PostgreSQL (DATABASE_URL): the fault is a database unreachable")
    proxy = TcpProxy(settings.get("HOST") or "127.0.0.1", int(settings.get("PORT") or 5432))
    proxy.start()
    yield proxy
    proxy.stop()
