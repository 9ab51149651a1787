"""Real Daphne processes for tests.

The listening socket is bound by the test process and handed to Daphne (``--fd``), so a
client can connect the moment the process is spawned: connections wait in the accept
queue until Daphne serves them. No sleeps, no readiness polling.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import httpx
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def database_url() -> str:
    """The URL of the database the test run uses (pytest-django's test database)."""
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{Path(s['NAME']).resolve()}"
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or 5432
    user = s.get("USER") or "postgres"
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{host}:{port}/{s['NAME']}"


class DaphneServer:
    def __init__(
        self,
        env: dict[str, str],
        name: str = "daphne",
        log_dir: Path | None = None,
        send_buffer: int | None = None,
    ):
        self.env = env
        # SO_SNDBUF for accepted connections (inherited from the listening socket): a small
        # kernel buffer makes a client that stops reading show up in the server quickly.
        self.send_buffer = send_buffer
        self.name = name
        self.log_dir = log_dir or ROOT / "test-artifacts" / "logs"
        self.sock: socket.socket | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self) -> DaphneServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.send_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        self.sock = sock
        self.port = sock.getsockname()[1]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"{self.name}-{self.port}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "--fd",
                str(sock.fileno()),
                "--proxy-headers",
                "chatsite.asgi:application",
            ],
            cwd=ROOT,
            env=self.env,
            pass_fds=(sock.fileno(),),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        return self

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: the process dies mid-whatever, as in a crash or OOM kill."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)
        self._close_socket()

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._close_socket()
        return self.proc.returncode

    def _close_socket(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


class TwoProcesses(NamedTuple):
    """Two Daphne processes sharing the database and Redis, and an HTTP client of each."""

    a: DaphneServer
    b: DaphneServer
    ca: httpx.AsyncClient
    cb: httpx.AsyncClient


def server_env(**overrides: Any) -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "chatsite.settings"
    env["DATABASE_URL"] = database_url()
    env.setdefault("STREAM_ABANDON_GRACE", "10")
    # A test's server stops at its end with an answer often still streaming: it is
    # interrupted at once instead of given the production drain (a test of the drain
    # sets its own deadline).
    env.setdefault("STREAM_SHUTDOWN_DEADLINE", "0.5")
    env["PYTHONUNBUFFERED"] = "1"
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    return env
